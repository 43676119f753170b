"""The domain transfer state machine as plain data and pure functions (no I/O, no clock).

Rules:
- `TRANSITIONS` is the spec's state table: a (state, trigger) pair not in it is refused.
  `None` stands for "no transfer yet" (initiate, and the admin's force transfer).
- Deadlines are facts of the record, not of the timer: a pending transfer past `expires_at`
  is expired and an accepted one past `cooloff_until` can no longer be stopped, even in the
  moments before the timer actor has written the new state (`effective_status`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

PENDING = "pending"
ACCEPTED = "accepted"
COMPLETED = "completed"
DECLINED = "declined"
CANCELLED = "cancelled"
REVERSED = "reversed"
EXPIRED = "expired"
STATES = (PENDING, ACCEPTED, COMPLETED, DECLINED, CANCELLED, REVERSED, EXPIRED)
ACTIVE = (PENDING, ACCEPTED)  # at most one of these per domain

EXPIRY = timedelta(days=7)
SAFETY_WINDOW = timedelta(hours=24)
NOTE_MAX = 1000
INITIATIONS_PER_WINDOW = 5
RATE_WINDOW = timedelta(minutes=1)


class Trigger(Enum):
    INITIATE = "initiate"
    ACCEPT = "accept"
    DECLINE = "decline"
    CANCEL = "cancel"
    EXPIRE = "expire"
    STOP = "stop"
    WINDOW_ENDS = "window_ends"
    FORCE = "force"


TRANSITIONS: dict[tuple[str | None, Trigger], str] = {
    (None, Trigger.INITIATE): PENDING,
    (PENDING, Trigger.ACCEPT): ACCEPTED,
    (PENDING, Trigger.DECLINE): DECLINED,
    (PENDING, Trigger.CANCEL): CANCELLED,
    (PENDING, Trigger.EXPIRE): EXPIRED,
    (ACCEPTED, Trigger.STOP): REVERSED,
    (ACCEPTED, Trigger.WINDOW_ENDS): COMPLETED,
    (None, Trigger.FORCE): COMPLETED,
}


def next_state(current: str | None, trigger: Trigger) -> str | None:
    """The state `trigger` leads to from `current`, or None when the table refuses it."""
    return TRANSITIONS.get((current, trigger))


def effective_status(
    status: str, expires_at: datetime, cooloff_until: datetime | None, now: datetime
) -> str:
    """The status the transfer has at `now`, counting deadlines the timer has not yet applied."""
    if status == PENDING and now >= expires_at:
        return EXPIRED
    if status == ACCEPTED and cooloff_until is not None and now >= cooloff_until:
        return COMPLETED
    return status


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why an action is refused: the HTTP-neutral error kind, its code and a human detail."""

    kind: str  # "not_found", "forbidden", "conflict", "gone"
    code: str
    detail: str


def accept_refusal(
    status: str,
    expires_at: datetime,
    now: datetime,
    *,
    is_recipient: bool,
    in_workspace: bool,
    domains_in_workspace: int,
    domain_limit: int,
) -> Refusal | None:
    """Why the caller may not accept this transfer now, or None when they may.

    The order is the spec's error table: the wrong account learns nothing about the state.
    """
    if not is_recipient:
        return Refusal("forbidden", "wrong_recipient", "this transfer was sent to another account")
    current = effective_status(status, expires_at, None, now)
    if current == EXPIRED:
        return Refusal("gone", "expired", "the 7-day window to accept this transfer has passed")
    if next_state(current, Trigger.ACCEPT) is None:
        return Refusal("conflict", "not_pending", f"the transfer is {current}, not pending")
    if not in_workspace:
        return Refusal(
            "forbidden", "org_access_lost", "you no longer belong to the chosen workspace"
        )
    if not within_domain_limit(domains_in_workspace, domain_limit):
        return Refusal(
            "forbidden",
            "domain_limit",
            f"the workspace's plan allows {domain_limit} domains and it has"
            f" {domains_in_workspace}; upgrade or remove a domain first",
        )
    return None


def within_domain_limit(current_domains: int, domain_limit: int) -> bool:
    """Whether one more domain fits (-1 is unlimited)."""
    return domain_limit < 0 or current_domains < domain_limit


def stop_refusal(
    status: str, expires_at: datetime, cooloff_until: datetime | None, now: datetime
) -> Refusal | None:
    """Why a stop token no longer stops its transfer, or None when it does."""
    current = effective_status(status, expires_at, cooloff_until, now)
    if next_state(current, Trigger.STOP) is None:
        return Refusal(
            "conflict", "not_stoppable", f"the transfer is {current}: the safety window is over"
        )
    return None


def pending_refusal(
    trigger: Trigger, status: str, expires_at: datetime, now: datetime
) -> Refusal | None:
    """Why a decline or cancel is refused (the transfer is no longer pending), or None."""
    current = effective_status(status, expires_at, None, now)
    if next_state(current, trigger) is None:
        return Refusal("conflict", "not_pending", f"the transfer is {current}, not pending")
    return None


@dataclass(frozen=True, slots=True)
class InitiateFacts:
    """What initiation checks, gathered by the caller from the database."""

    active_transfer: bool
    broadcasts_in_flight: Sequence[object]
    scheduled_emails: int
    target_exists: bool
    target_is_self: bool


def initiate_refusal(facts: InitiateFacts) -> Refusal | None:
    """Why a transfer may not be initiated, or None: the spec's preconditions, in its order."""
    if facts.active_transfer:
        return Refusal(
            "conflict", "transfer_active", "a pending or accepted transfer exists for this domain"
        )
    if facts.broadcasts_in_flight:
        return Refusal(
            "conflict",
            "broadcasts_in_flight",
            "broadcasts from this domain's senders are sending or scheduled",
        )
    if facts.scheduled_emails:
        return Refusal(
            "conflict",
            "scheduled_emails",
            f"the domain has {facts.scheduled_emails} scheduled emails; cancel or send them first",
        )
    if not facts.target_exists:
        return Refusal("not_found", "target_not_found", "no account uses the target email")
    if facts.target_is_self:
        return Refusal("conflict", "self_transfer", "the target is your own account")
    return None


def retry_after(attempts: Sequence[datetime], now: datetime) -> int | None:
    """Seconds to wait before another initiation, or None when one is allowed now.

    `attempts` are this user's initiation attempts; the limit is a sliding window.
    """
    recent = sorted(a for a in attempts if a > now - RATE_WINDOW)
    if len(recent) < INITIATIONS_PER_WINDOW:
        return None
    frees_at = recent[len(recent) - INITIATIONS_PER_WINDOW] + RATE_WINDOW
    return max(1, math.ceil((frees_at - now).total_seconds()))
