"""A minimal SVG logo for BIMI uploads: a square, in a document of one line."""

from __future__ import annotations

LOGO = b'<?xml version="1.0"?><svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 10 10"><rect width="10" height="10"/></svg>'
