"""Test peers (DNS, SMTP, HTTPS) and TLS material that stand in for the outside world."""
