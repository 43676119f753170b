"""What each role in a workspace may do: one table, checked once per request.

A workspace's members each hold one role: `owner` (exactly one per workspace), `admin`,
`developer` or `viewer`. What a caller may change is named by an *area*; reading is open to
every member. The API (api/auth.py) and the console (console/web.py) name the area of each
of their routes (api/permissions.py) and ask `require` before the route runs.

An API key belongs to its workspace, not to the member who made it, and acts as keys always
have (role `api_key`): everything an admin may do but the team itself, which only a person
signed in to the console changes, so a leaked key cannot let anyone into the workspace.
"""

from __future__ import annotations

from engine.platform.errors import Forbidden

ROLES = ("owner", "admin", "developer", "viewer")
# What an API key acts as (not a member role: no one holds it).
KEY_ROLE = "api_key"

# Areas a change falls in.
SELF = "self"  # one's own session, password, workspace choice, leaving a workspace
SEND = "send"  # emails, broadcasts, templates, contact lists, suppressions, verification
KEYS = "keys"  # API keys and SMTP credentials
WEBHOOKS = "webhooks"
DOMAINS = "domains"  # domains, senders, transfers, BIMI, forwards, reports' settings
DELIVERY = "delivery"  # delivery control: policies, ramps, incidents, queue actions, guard
MCP_POLICY = "mcp_policy"
WORKSPACE = "workspace"  # sandbox mode, retention and erasure, the unsubscribe footer
MEMBERS = "members"  # invitations, roles, removing members
OWNERSHIP = "ownership"  # handing the workspace to another member
SECURITY = "security"  # requiring two-factor sign-in of every member

_DEVELOPER = frozenset({SELF, SEND, KEYS, WEBHOOKS})
_ADMIN = _DEVELOPER | {DOMAINS, DELIVERY, MCP_POLICY, WORKSPACE, MEMBERS}

# The table: which areas each role may change. Every role reads everything in the workspace.
MAY_CHANGE: dict[str, frozenset[str]] = {
    "owner": _ADMIN | {OWNERSHIP, SECURITY},
    "admin": _ADMIN,
    "developer": _DEVELOPER,
    "viewer": frozenset({SELF}),
    KEY_ROLE: _ADMIN - {MEMBERS},
}


def may(role: str, area: str) -> bool:
    """Whether `role` may change what lies in `area`."""
    return area in MAY_CHANGE.get(role, frozenset())


def require(role: str, area: str) -> None:
    """Forbidden `role_forbidden` unless `role` may change what lies in `area`."""
    if not may(role, area):
        raise Forbidden(
            f"your role ({role}) may not change this; ask an owner or admin of the workspace",
            code="role_forbidden",
        )


def check_role(value: str) -> str:
    """`value` if it names a member role; the API's models check the same list."""
    if value not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}")
    return value
