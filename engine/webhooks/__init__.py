"""Webhook endpoints and the dispatcher that delivers their signed events."""
