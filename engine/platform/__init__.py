"""The engine's ground floor: what every feature runs on and none of them is.

The runtime handed to every engine function, the clock, errors, faults and the supervisor,
wake-ups, leased workers, nodes and their tenure, DNS and outbound HTTP, private networks,
message memory, and the operator's settings the runtime carries. No module here imports a
feature of `engine/` (tests/test_layers.py holds it so): features import the platform.
"""
