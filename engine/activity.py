"""Activity-log entries: every state change on a workspace resource writes one.

Entries are written inside the same unit of work as the change they describe, so the log
never claims a change that was rolled back, nor misses one that was committed.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from engine.platform.runtime import Principal, Runtime
from storage import activity
from storage.codec import new_id
from storage.tx import Tx

CATEGORIES = ("Security", "Domain", "Send", "Team", "Billing")

# Which category each resource's actions fall in (docs/architecture.md section 7).
_CATEGORY_OF_RESOURCE = {
    "api_key": "Security",
    "smtp_credential": "Security",
    "webhook": "Security",
    "session": "Security",
    "password": "Security",
    "two_factor": "Security",  # a user's TOTP, and a workspace requiring it
    "domain": "Domain",
    "sender": "Domain",
    "transfer": "Domain",
    "bimi": "Domain",
    "forward": "Domain",
    "broadcast": "Send",
    "template": "Send",
    "contact_list": "Send",
    "suppression": "Send",
    "privacy": "Send",
    "member": "Team",
    "workspace": "Billing",
    "sandbox": "Security",  # mail captured or sent for real
    "mcp_policy": "Security",  # what agents may do through the MCP door
    "queue": "Send",  # queue actions by search: hold, release, cancel, retry now
    "delivery_policy": "Send",
    "delivery_ramp": "Send",
    "delivery_incident": "Send",
    "unsubscribe_footer": "Send",
    "complaint_guard": "Send",
    "email": "Send",  # only the emails an agent sends, one by one (engine/sending/intake.py)
}

_TARGET_TYPE = {
    "api_key": "API key",
    "smtp_credential": "SMTP credential",
    "webhook": "Webhook",
    "session": "Session",
    "password": "User",
    "two_factor": "Two-factor sign-in",
    "domain": "Domain",
    "sender": "Sender",
    "transfer": "Domain transfer",
    "bimi": "BIMI",
    "forward": "Forward",
    "broadcast": "Broadcast",
    "template": "Template",
    "contact_list": "Contact list",
    "suppression": "Suppression",
    "privacy": "Personal data",
    "member": "Member",
    "workspace": "Workspace",
    "sandbox": "Sandbox mode",
    "mcp_policy": "MCP policy",
    "queue": "Delivery queue",
    "delivery_policy": "Delivery policy",
    "delivery_ramp": "Warm-up ramp",
    "delivery_incident": "Destination incident",
    "unsubscribe_footer": "Unsubscribe footer",
    "complaint_guard": "Complaint-rate guard",
    "email": "Email",
}


@dataclass(frozen=True, slots=True)
class Change:
    """One state change to log: `action` is `<resource>.<verb>`."""

    action: str
    target_name: str
    target_id: str | None
    meta: dict[str, Any] | None = None


# The door an action came through when it is not the API or the console (`meta.via`, and
# `meta.client` naming the client): set around the engine calls that door makes. Units of work
# run in their caller's context (storage/database.py), so entries written there see it.
_through: ContextVar[tuple[str, str] | None] = ContextVar("activity_through", default=None)


@contextmanager
def acting_through(via: str, client: str) -> Iterator[None]:
    """Attribute every entry recorded inside the block to door `via` and its `client`."""
    token = _through.set((via, client))
    try:
        yield
    finally:
        _through.reset(token)


def record(tx: Tx, workspace_id: str, actor: str, change: Change, at: datetime) -> None:
    """Append the entry for `change` inside the caller's transaction."""
    resource = change.action.split(".", 1)[0]
    meta = dict(change.meta or {})
    if (through := _through.get()) is not None:
        meta["via"], meta["client"] = through
    activity.append(
        tx,
        activity.ActivityEntry(
            id=new_id(),
            workspace_id=workspace_id,
            actor=actor,
            action=change.action,
            target_type=_TARGET_TYPE[resource],
            target_name=change.target_name,
            target_id=change.target_id,
            category=_CATEGORY_OF_RESOURCE[resource],
            meta=meta,
            created_at=at,
        ),
    )


def canonical_category(value: str) -> str | None:
    """The category named case-insensitively, or None when there is no such category."""
    for category in CATEGORIES:
        if category.lower() == value.lower():
            return category
    return None


RANGES = {
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "90d": timedelta(days=90),
}


async def recent(
    rt: Runtime, who: Principal, range_name: str, category: str | None, limit: int
) -> tuple[list[activity.ActivityEntry], int]:
    """Entries of the range (and category), newest first, at most `limit`; and the total."""
    since = rt.clock.now() - RANGES[range_name]
    return await rt.db.read(activity.newest, who.workspace_id, since, category, limit)
