"""SMTP front doors: the submission relay (587, STARTTLS + AUTH) and the inbound MX (25).

Listeners and per-connection drivers only; the SMTP protocol itself lives in `engine/smtp/`.
"""
