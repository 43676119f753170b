"""Templates and the variables they render."""
