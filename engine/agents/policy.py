"""Each workspace's MCP policy: how far agents may act, and how many recipients at once.

`off` shuts the door; `read` (the default) lets agents search, read, validate and preview;
`send` adds sending and managing, every send through a preview and its confirmation. The
policy changes only through a person's login session (the API with the session cookie, or the
console), never with an API key: the key is what an agent holds, and it must not be able to
widen its own policy. Every change is logged.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.accounts import roles
from engine.activity import Change, record
from engine.platform.errors import Forbidden, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import agents
from storage.tx import Tx

OFF, READ, SEND = "off", "read", "send"
LEVELS = (OFF, READ, SEND)  # each allows what the ones before it allow
DEFAULT_LEVEL = READ
DEFAULT_MAX_RECIPIENTS = 100
MAX_RECIPIENTS_CEILING = 1_000_000  # the largest contact list a plan holds


@dataclass(frozen=True, slots=True)
class McpPolicy:
    level: str
    max_recipients: int
    updated_at: datetime | None  # None: never changed, the defaults apply

    def allows(self, needed: str) -> bool:
        return LEVELS.index(self.level) >= LEVELS.index(needed)


DEFAULT = McpPolicy(DEFAULT_LEVEL, DEFAULT_MAX_RECIPIENTS, None)


def _policy(tx: Tx, workspace_id: str) -> McpPolicy:
    stored = agents.get_policy(tx, workspace_id)
    if stored is None:
        return DEFAULT
    return McpPolicy(stored.policy, stored.max_recipients, stored.updated_at)


async def current(rt: Runtime, who: Principal) -> McpPolicy:
    """The workspace's policy (the defaults when it never changed them)."""
    return await rt.db.read(_policy, who.workspace_id)


def require(policy: McpPolicy, needed: str) -> None:
    """Forbidden (`mcp_policy`) unless `policy` allows what needs `needed`."""
    if policy.allows(needed):
        return
    if policy.level == OFF:
        detail = "the MCP door is off for this workspace"
    else:
        detail = f"this needs the MCP policy `{needed}`; the workspace's is `{policy.level}`"
    raise Forbidden(
        f"{detail} (an operator sets it with PATCH /v1/mcp/policy)",
        code="mcp_policy",
        policy=policy.level,
        needed=needed,
    )


async def gate(rt: Runtime, who: Principal, needed: str) -> McpPolicy:
    """The workspace's policy, if it allows `needed`; Forbidden (`mcp_policy`) otherwise.
    What needs `send` also needs a caller whose role sends (engine/accounts/roles.py): the
    MCP door is not a way round a viewer's role."""
    if needed == SEND:
        roles.require(who.role, roles.SEND)
    policy = await current(rt, who)
    require(policy, needed)
    return policy


def check_cap(policy: McpPolicy, recipients: int) -> None:
    """Forbidden (`recipient_cap`) when one agent action would reach more recipients than
    the workspace allows."""
    if recipients > policy.max_recipients:
        raise Forbidden(
            f"this action reaches {recipients} recipients; agents may reach at most"
            f" {policy.max_recipients} per action (the workspace's MCP max_recipients)",
            code="recipient_cap",
            recipients=recipients,
            max_recipients=policy.max_recipients,
        )


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(f"{field}: {message}", errors=[{"loc": ["body", field], "msg": message}])


def _update(
    tx: Tx, who: Principal, level: str | None, max_recipients: int | None, now: datetime
) -> McpPolicy:
    before = _policy(tx, who.workspace_id)
    after = McpPolicy(
        before.level if level is None else level,
        before.max_recipients if max_recipients is None else max_recipients,
        now,
    )
    agents.put_policy(tx, agents.Policy(who.workspace_id, after.level, after.max_recipients, now))
    meta = {
        "policy": after.level,
        "max_recipients": after.max_recipients,
        "previous": {"policy": before.level, "max_recipients": before.max_recipients},
    }
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("mcp_policy.updated", "MCP door", None, meta),
        now,
    )
    return after


async def update(
    rt: Runtime, who: Principal, level: str | None, max_recipients: int | None
) -> McpPolicy:
    """Change the policy and/or the recipient cap (None keeps a value); logged every time
    something is set. Forbidden (`session_required`) with an API key."""
    if who.session_id is None:
        raise Forbidden(
            "the MCP policy is changed by a person logged in (session cookie or console), not"
            " with an API key: an agent holding the key could otherwise widen its own policy",
            code="session_required",
        )
    if level is not None and level not in LEVELS:
        raise _invalid("policy", f"must be one of {', '.join(LEVELS)}")
    if max_recipients is not None and not 1 <= max_recipients <= MAX_RECIPIENTS_CEILING:
        raise _invalid("max_recipients", f"must be between 1 and {MAX_RECIPIENTS_CEILING:,}")
    if level is None and max_recipients is None:
        return await current(rt, who)
    return await rt.db.write(_update, who, level, max_recipients, rt.clock.now())
