"""Postroom's domain rules and long-lived Trio actors.

The engine knows nothing of HTTP or SMTP servers: front doors call its functions and render
what they return. It depends only on `storage`.
"""
