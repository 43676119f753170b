"""The delivery engine: a router and one queue actor per recipient domain
(docs/architecture.md section 6)."""
