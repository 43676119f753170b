"""Sending domains: registration, DKIM keys, DNS checks, senders and BIMI."""
