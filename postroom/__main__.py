"""`python -m postroom` runs the command line."""

from postroom.cli import main

main()
