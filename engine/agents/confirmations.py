"""One-time confirmation tokens: what stands between an agent's preview and a real send.

A token is 256 random bits, shown once in the preview and stored only as its SHA-256 beside
the exact action it confirms (its kind and payload, frozen at the preview: editing a template
or a draft afterwards changes nothing). It is good for LIFETIME, for the credential that
previewed (that API key or login session, in its workspace: another key of the same user
cannot confirm it, and it dies with its key or session), and once: it is spent when `redeem`
hands its action out, before the action runs, so a confirm that fails half-way or is retried
never sends twice.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from engine.accounts.passwords import token_hash
from engine.agents.policy import McpPolicy, check_cap
from engine.platform.errors import Conflict, Gone, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import agents
from storage.tx import Tx

LIFETIME = timedelta(minutes=10)
# Spent and expired tokens are kept this long, so a late confirm hears "expired" or "used"
# rather than "unknown".
KEPT_AFTER_EXPIRY = timedelta(days=1)
PREFIX = "cfm_"


@dataclass(frozen=True, slots=True)
class Issued:
    token: str
    expires_at: datetime


@dataclass(frozen=True, slots=True)
class Pending:
    """A confirmed action, handed out once: its kind, payload and previewed recipients."""

    action: str
    payload: dict[str, Any]
    recipients: int


def _issue(tx: Tx, confirmation: agents.Confirmation, now: datetime) -> None:
    agents.prune_confirmations(tx, confirmation.workspace_id, now - KEPT_AFTER_EXPIRY)
    agents.insert_confirmation(tx, confirmation)


async def issue(
    rt: Runtime, who: Principal, action: str, payload: dict[str, Any], recipients: int
) -> Issued:
    """A new token confirming `action` with `payload` (to `recipients` addresses)."""
    token = PREFIX + secrets.token_urlsafe(32)
    now = rt.clock.now()
    confirmation = agents.Confirmation(
        token_hash=token_hash(token),
        workspace_id=who.workspace_id,
        user_id=who.user_id,
        credential=who.credential,
        action=action,
        payload=payload,
        recipients=recipients,
        created_at=now,
        expires_at=now + LIFETIME,
        used_at=None,
    )
    await rt.db.write(_issue, confirmation, now)
    return Issued(token, confirmation.expires_at)


def _redeem(tx: Tx, who: Principal, policy: McpPolicy, hashed: str, now: datetime) -> Pending:
    found = agents.get_confirmation(tx, hashed)
    # Another credential's token (another user's or workspace's, or the same user's other key
    # or session) is as unknown as a made-up one.
    mine = (who.workspace_id, who.user_id, who.credential)
    if found is None or (found.workspace_id, found.user_id, found.credential) != mine:
        raise NotFound(
            "unknown confirmation token: preview the action to get one", code="unknown_token"
        )
    used = Conflict("this confirmation token was already used", code="token_used")
    if found.used_at is not None:
        raise used
    if found.expires_at <= now:
        raise Gone(
            f"this confirmation token expired at {found.expires_at:%H:%M:%S} UTC:"
            " preview the action again",
            code="token_expired",
        )
    # The cap may have been lowered since the preview; a refused token stays unspent.
    check_cap(policy, found.recipients)
    if not agents.use_confirmation(tx, hashed, now):  # another node's confirm won the race
        raise used
    return Pending(found.action, found.payload, found.recipients)


async def redeem(rt: Runtime, who: Principal, policy: McpPolicy, token: str) -> Pending:
    """Spend a token and hand out the action it confirms; NotFound (unknown, or another
    credential's), Conflict (already used), Gone (expired) or Forbidden (over the workspace's
    recipient cap) otherwise."""
    if not token.startswith(PREFIX) or len(token) > 100:
        raise NotFound(
            "unknown confirmation token: preview the action to get one", code="unknown_token"
        )
    return await rt.db.write(_redeem, who, policy, token_hash(token), rt.clock.now())
