"""Who a request to the MCP door acts for, as the HTTP edge hands it to the MCP server.

Apart from the server (mcp_door/server.py) so that the edge (mcp_door/http.py) names it
without loading the SDK, which the service loads in the background after it starts.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.platform.runtime import Principal

# Where the HTTP door leaves the authenticated caller in each request's ASGI scope.
CALLER = "postroom.mcp.caller"


@dataclass(frozen=True, slots=True)
class Caller:
    """Who a request acts for, and the client's name when the transport carries it (the
    session of a client that named itself in the initialize handshake)."""

    who: Principal
    client: str | None = None
