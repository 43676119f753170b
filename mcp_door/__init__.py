"""The MCP door: agents act on a workspace through the Model Context Protocol.

A front door like `api/` and `relay/`: Streamable HTTP at `/mcp` on the API's port
(mcp_door/http.py) and `postroom mcp --stdio` for local clients (mcp_door/stdio.py, a bridge
to a running service). Its tools and resources (tools.py, resources.py) call the same engine
functions as the API; what agents may do is the workspace's MCP policy (engine/agents).
"""
