"""Accepting email at every door (API, batch, relay, system mail) and reading the log."""
