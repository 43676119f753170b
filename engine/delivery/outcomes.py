"""What one recipient's verdict does to the record: its events, its status move, a
suppression, a destination incident. Pure (no I/O, no clock): the delivery round
(engine/delivery/domain_queue.py) gathers these effects and writes them in one unit of work.

engine/delivery/classify.py alone decides the verdict from what happened; this module alone
decides what the verdict records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.delivery import retry
from engine.delivery.classify import Decision, Verdict
from engine.sending import statuses
from engine.sending.statuses import Trigger
from storage.emails import Email, Recipient, RecipientUpdate
from storage.incidents import Hit
from storage.suppressions import Suppression


@dataclass(frozen=True, slots=True)
class Effects:
    """What one recipient's outcome records."""

    events: tuple[tuple[str, dict[str, Any]], ...]  # (kind, metadata), in the order they happened
    update: RecipientUpdate  # its status move (with its next attempt when deferred)
    suppression: Suppression | None = None  # a hard bounce's, in the email's workspace
    # A destination incident the outcome hit (the sending side's problem), for the email's
    # (workspace, sending domain); `delivered` resolves that pair's open incident instead.
    incident: Hit | None = None
    delivered: bool = False
    # The mailbox was full: counted when recorded (engine/delivery/full_mailboxes.py); the
    # last event and the update are the ones a mailbox full for days turns into a bounce.
    mailbox_full: bool = False


def effects(
    email: Email,
    recipient: Recipient,
    decision: Decision,
    now: datetime,
    via: Mapping[str, Any] | None = None,  # the server that replied: MX host, address, TLS
    facts: Mapping[str, str] | None = None,  # a deferral's TLS policy, and why
) -> Effects:
    """The effects of `decision` on `recipient` of `email`, decided at `now`."""
    address, response = recipient.address, decision.response
    meta: dict[str, Any] = {"subject": email.subject, "tags": email.tags}
    events: list[tuple[str, dict[str, Any]]] = []

    def event(kind: str, **more: Any) -> None:
        events.append((kind, meta | more))

    def update(trigger: Trigger, when: datetime | None = None) -> RecipientUpdate:
        status = statuses.recipient_next(recipient.status, trigger)
        return RecipientUpdate(email.id, address, status, when, response)

    verdict = decision.verdict
    if verdict is Verdict.DELIVERED:
        event("sent", domain=recipient.domain)
        event("delivered", domain=recipient.domain, smtp_response=response, **(via or {}))
        return Effects(tuple(events), update(Trigger.ACCEPTED_BY_MX), delivered=True)
    if verdict is Verdict.UNDELIVERABLE:
        # Refused for the message (size, content, format, a policy), not the recipient.
        blamed = None if decision.blame is None else decision.blame.value
        event("failed", error=response, dsn=decision.dsn, response=response, blame=blamed)
        return Effects(tuple(events), update(Trigger.UNDELIVERABLE))
    if verdict in (Verdict.BOUNCED, Verdict.REFUSED):
        refused = verdict is Verdict.REFUSED
        # A refusal of our session says nothing about the address: no suppression.
        blame = {"blame": "destination"} if refused else {}
        event("bounced", dsn=decision.dsn, response=response, bounce_type="hard", **blame)
        entry = None if refused else Suppression(address, "hard_bounce", now, email.id)
        return Effects(tuple(events), update(Trigger.PERMANENT), suppression=entry)
    if verdict in (Verdict.DEFERRED, Verdict.INCIDENT, Verdict.SOFT_BOUNCED):
        hit = None
        if decision.incident is not None:
            # The sending side's problem: the recipient waits, the destination pauses.
            meta["incident"] = decision.incident.value
            sending_domain = email.from_address.rpartition("@")[2].lower()
            hit = Hit(decision.incident.value, sending_domain, response)
        # Time spent held or waiting for a policy budget is not counted (expiry_from).
        since = recipient.expiry_from or recipient.queued_at
        when = retry.next_attempt(recipient.attempts + 1, since, now)
        full = verdict is Verdict.SOFT_BOUNCED
        if full:
            meta |= {"bounce_type": "soft", "dsn": decision.dsn}
        if when is None:
            event("failed", error=f"gave up after 72 hours: {response}")
            moved = update(Trigger.GAVE_UP)
        else:
            event("deferred", response=response, next_attempt_at=when.isoformat(), **(facts or {}))
            moved = update(Trigger.TEMPORARY, when)
        return Effects(tuple(events), moved, incident=hit, mailbox_full=full)
    event("failed", error=response)
    return Effects(tuple(events), update(Trigger.GAVE_UP))


def unreadable(recipient: Recipient, decision: Decision, error: str) -> Effects:
    """A recipient of an email whose stored row cannot be read: failed, nothing sent (no
    subject or tags to tell: they are in the row)."""
    status = statuses.recipient_next(recipient.status, Trigger.GAVE_UP)
    update = RecipientUpdate(recipient.email_id, recipient.address, status, None, decision.response)
    return Effects((("failed", {"error": error}),), update)
