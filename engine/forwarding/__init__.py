"""Inbound mail: forward rules, the forwarder, and reports at bounce addresses."""
