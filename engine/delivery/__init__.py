"""The delivery engine: a router and one queue actor per recipient domain (DESIGN.md 1)."""
