"""Email and recipient statuses as data (docs/architecture.md section 7), like transfers/rules.py.

Rules:
- A recipient moves only along `RECIPIENT_TRANSITIONS`: an outcome of a delivery attempt (or a
  cancel) from a waiting status; any other move is a bug the table refuses.
- An email's own moves (`EMAIL_TRANSITIONS`) happen before delivery starts: accept, send now,
  cancel, reject on a new suppression check. Once delivering, its status is `summary()` of its
  recipients', except that `cancelled` and `rejected` are final.
- Retry is allowed from `RETRYABLE` only; it makes a new email, the original stays as it is.
- `held` is a waiting status no delivery round claims: queue actions (engine/sending/
  queue_actions.py) hold waiting recipients, release them to `queued` or cancel them.
- Storage never picks a status for a move: it is handed one of these tables' moves
  (`email_move`, `recipients_move`, storage/emails.py `Move`) and carries it out.
"""

from __future__ import annotations

from collections.abc import Iterable
from enum import Enum

from storage.delivery import Unheld
from storage.emails import Move, Summary

SCHEDULED = "scheduled"
QUEUED = "queued"
SENDING = "sending"
DELIVERED = "delivered"
DEFERRED = "deferred"
BOUNCED = "bounced"
FAILED = "failed"
REJECTED = "rejected"
CANCELLED = "cancelled"
HELD = "held"
EMAIL_STATUSES = (
    SCHEDULED,
    QUEUED,
    SENDING,
    DELIVERED,
    DEFERRED,
    BOUNCED,
    FAILED,
    REJECTED,
    CANCELLED,
    HELD,
)
WAITING = (QUEUED, DEFERRED)  # a recipient still to be tried
FINAL_EMAIL = (CANCELLED, REJECTED)  # never summarised again
RETRYABLE = (BOUNCED, REJECTED, FAILED)
# An outcome a node kept through a database outage (engine/delivery/domain_queue.py `Kept`)
# is written over a recipient it no longer holds only when no node holds it and it still
# waits, and only when the outcome ends it: a message the MX took (or refused for good) is not
# sent again, while a kept deferral could only push back a retry scheduled since.
UNHELD = Unheld(WAITING, (DELIVERED, BOUNCED, FAILED))


class Trigger(Enum):
    """What moves an email before delivery, or a recipient during it."""

    ACCEPT = "accept"
    ACCEPT_SCHEDULED = "accept_scheduled"
    ACCEPT_SUPPRESSED = "accept_suppressed"
    SEND_NOW = "send_now"
    SEND_NOW_SUPPRESSED = "send_now_suppressed"
    CANCEL = "cancel"
    # A delivery attempt's outcome, per recipient (engine/delivery/classify.py decides it).
    ACCEPTED_BY_MX = "accepted_by_mx"  # 250 to the data
    TEMPORARY = "temporary"  # 4xx or unreachable, time left
    PERMANENT = "permanent"  # 5xx: a hard bounce
    UNDELIVERABLE = "undeliverable"  # 5xx about the message, not the recipient: failed
    GAVE_UP = "gave_up"  # 72 hours of temporary failures, or unreadable, or quarantined
    # Queue actions by search, on waiting and held recipients.
    HOLD = "hold"
    RELEASE = "release"
    RETRY_NOW = "retry_now"
    THROTTLED = "throttled"  # waits for a policy or ramp budget: not an attempt


EMAIL_TRANSITIONS: dict[tuple[str | None, Trigger], str] = {
    (None, Trigger.ACCEPT): QUEUED,
    (None, Trigger.ACCEPT_SCHEDULED): SCHEDULED,
    (None, Trigger.ACCEPT_SUPPRESSED): REJECTED,
    (SCHEDULED, Trigger.SEND_NOW): QUEUED,
    (SCHEDULED, Trigger.SEND_NOW_SUPPRESSED): REJECTED,
    (SCHEDULED, Trigger.CANCEL): CANCELLED,
}

RECIPIENT_TRANSITIONS: dict[tuple[str, Trigger], str] = {
    **{(waiting, Trigger.ACCEPTED_BY_MX): DELIVERED for waiting in WAITING},
    **{(waiting, Trigger.TEMPORARY): DEFERRED for waiting in WAITING},
    **{(waiting, Trigger.THROTTLED): DEFERRED for waiting in WAITING},
    **{(waiting, Trigger.PERMANENT): BOUNCED for waiting in WAITING},
    **{(waiting, Trigger.GAVE_UP): FAILED for waiting in WAITING},
    **{(waiting, Trigger.UNDELIVERABLE): FAILED for waiting in WAITING},
    **{(waiting, Trigger.CANCEL): CANCELLED for waiting in WAITING},
    **{(waiting, Trigger.HOLD): HELD for waiting in WAITING},
    **{(waiting, Trigger.RETRY_NOW): waiting for waiting in WAITING},  # due now, same status
    (HELD, Trigger.RELEASE): QUEUED,
    (HELD, Trigger.CANCEL): CANCELLED,
    # A DSN that arrives after the MX took the message turns a delivery into a bounce.
    (DELIVERED, Trigger.PERMANENT): BOUNCED,
    # ... and into a failure when it refused the message, not the recipient.
    (DELIVERED, Trigger.UNDELIVERABLE): FAILED,
}

# The email's status from its recipients': the first row any recipient matches.
SUMMARY: tuple[tuple[tuple[str, ...], str], ...] = (
    ((QUEUED, SENDING), QUEUED),
    ((DEFERRED,), DEFERRED),
    # Still waiting, for a release: the email is not done while any recipient is held.
    ((HELD,), HELD),
    ((DELIVERED,), DELIVERED),
    ((BOUNCED,), BOUNCED),
    ((FAILED,), FAILED),
)
# Every recipient cancelled (a queue action's cancel): the email is cancelled.
SUMMARY_OTHERWISE = CANCELLED


def email_next(current: str | None, trigger: Trigger) -> str:
    """The status `trigger` moves an email to from `current`; ValueError if not allowed."""
    try:
        return EMAIL_TRANSITIONS[(current, trigger)]
    except KeyError:
        raise ValueError(f"an email that is {current} cannot {trigger.value}") from None


def email_move(current: str, trigger: Trigger) -> Move:
    """The move `trigger` makes of an email that is `current`, for storage to carry out."""
    return Move((current,), email_next(current, trigger))


def recipients_move(trigger: Trigger, current: tuple[str, ...] = WAITING) -> Move:
    """The move `trigger` makes of recipients in any of `current`, all to one status, for
    storage to carry out; ValueError if the table sends them to several or does not allow it."""
    [target] = {recipient_next(status, trigger) for status in current}
    return Move(current, target)


def recipient_next(current: str, trigger: Trigger) -> str:
    """The status `trigger` moves a recipient to from `current`; ValueError if not allowed."""
    try:
        return RECIPIENT_TRANSITIONS[(current, trigger)]
    except KeyError:
        raise ValueError(f"a recipient that is {current} cannot be {trigger.value}") from None


def summary(recipient_statuses: Iterable[str]) -> str:
    """An email's status from its recipients' (delivery is tracked per recipient)."""
    present = set(recipient_statuses)
    for members, status in SUMMARY:
        if present.intersection(members):
            return status
    return SUMMARY_OTHERWISE


# What storage is handed to summarise emails after their recipients moved.
SUMMARISE = Summary(summary, FINAL_EMAIL, DELIVERED)
