"""What the MCP door tells every agent at the handshake: how its policy and sends work.

A module of its own, free of engine imports, so that the stdio bridge (mcp_door/stdio.py),
which tells the local client the same, starts without loading the engine.
"""

INSTRUCTIONS = """\
Postroom delivers email for this workspace. What you may do is the workspace's MCP policy:
`read` lets you search, read, validate and preview; `send` adds sending and managing. A send
(send_email, retry_email, send_broadcast) never sends by itself: it answers a preview and a
one-time confirmation_token; show the preview to the user, and call `confirm` with the token
only once they agree. Failures come back as {"code", "detail"}."""
