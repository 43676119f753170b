"""Agents acting through the Model Context Protocol: what a workspace lets them do.

The MCP door (mcp_door/) calls the same engine functions as the API; this package holds the
rules only agents are held to: the workspace's policy (`off`, `read`, `send`), the preview and
one-time confirmation every agent send goes through, the cap on recipients per agent action,
and the attribution of their changes in the activity log.
"""
