"""MCP clients in the activity log: every change an agent makes says it came through MCP.

The client names itself (`clientInfo.name` of the MCP initialize handshake, or of each request
in the stateless protocol revisions); the name is the client's own claim, so it is folded to
one printable line of at most MAX_NAME characters before it is written anywhere.
"""

from __future__ import annotations

import re
from contextlib import AbstractContextManager

from engine import activity

VIA = "mcp"
UNKNOWN = "unknown"
MAX_NAME = 100
_UNPRINTABLE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029\s]+")


def client_name(claimed: str | None) -> str:
    """The name to log for a client that called itself `claimed`."""
    name = _UNPRINTABLE.sub(" ", claimed or "").strip()[:MAX_NAME].strip()
    return name or UNKNOWN


def acting_through_mcp(claimed: str | None) -> AbstractContextManager[None]:
    """Attribute the changes made inside the block to MCP and the client (`meta.via`,
    `meta.client` of their activity entries)."""
    return activity.acting_through(VIA, client_name(claimed))
