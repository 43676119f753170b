"""Reports the service sends about its own delivery: SMTP TLS reports (RFC 8460)."""
