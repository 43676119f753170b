"""Recording bounce reports and complaints that arrived at an email's bounce address.

The email comes from the bounce address; only its own recipients are acted on, so a forged
report cannot suppress addresses the email was never sent to. The writes go through the
delivery engine's `record_outcomes`, so an asynchronous bounce looks exactly like one
answered during the SMTP session: the recipient `bounced`, a `bounced` event (webhooks get
`email.bounced`) and a `hard_bounce` suppression. A delayed DSN is recorded as a `deferred`
event only; a complaint writes `complained` and a `complaint` suppression. Each is recorded
once.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from engine.mail.reports import RecipientStatus, Report
from engine.sending import statuses as email_statuses
from engine.webhooks import outbox
from storage import delivery, emails
from storage.codec import new_id
from storage.emails import Email, Event, RecipientUpdate
from storage.suppressions import Suppression
from storage.tx import Tx


class _Changes:
    def __init__(self, email: Email, now: datetime) -> None:
        self.email = email
        self.now = now
        self.updates: list[RecipientUpdate] = []
        self.events: list[Event] = []
        self.suppressions: list[tuple[str, Suppression]] = []

    def event(self, kind: str, recipient: str, **meta: Any) -> None:
        metadata = {"subject": self.email.subject, "tags": self.email.tags, **meta}
        at = self.now + timedelta(microseconds=len(self.events))
        self.events.append(
            Event(new_id(), self.email.id, self.email.workspace_id, kind, recipient, metadata, at)
        )

    def suppress(self, address: str, reason: str) -> None:
        entry = Suppression(address, reason, self.now, self.email.id)
        self.suppressions.append((self.email.workspace_id, entry))


def _dsn(changes: _Changes, statuses: dict[str, str], entries: tuple[RecipientStatus, ...]) -> None:
    for entry in entries:
        current = statuses.get(entry.recipient)
        if current is None or current == "bounced":
            continue
        response = entry.diagnostic or entry.status
        if entry.permanent:
            changes.event(
                "bounced",
                entry.recipient,
                dsn=entry.status,
                response=response,
                bounce_type="hard",
            )
            changes.updates.append(
                RecipientUpdate(changes.email.id, entry.recipient, "bounced", None, response)
            )
            changes.suppress(entry.recipient, "hard_bounce")
        elif entry.delayed:
            changes.event("deferred", entry.recipient, dsn=entry.status, response=response)


def _complaint(changes: _Changes, statuses: dict[str, str], report: Report, tx: Tx) -> None:
    named = [a for a in report.complainants if a in statuses]
    # Most mailbox providers redact the complainant; the bounce address still names the
    # email, and with one recipient that names the address too.
    if not named and len(statuses) == 1:
        named = list(statuses)
    already = {
        e.recipient for e in emails.events_of(tx, changes.email.id) if e.event_type == "complained"
    }
    for address in named:
        if address in already:
            continue
        changes.event("complained", address, feedback_type=report.feedback_type)
        changes.suppress(address, "complaint")


def record(tx: Tx, email: Email, report: Report, now: datetime) -> None:
    """Apply a DSN or complaint about one email, in the caller's transaction."""
    statuses = {r.address: r.status for r in emails.recipients_of(tx, email.id)}
    changes = _Changes(email, now)
    if report.kind == "dsn":
        _dsn(changes, statuses, report.statuses)
    else:
        _complaint(changes, statuses, report, tx)
    if changes.events:
        delivery.record_outcomes(
            tx,
            changes.updates,
            changes.events,
            changes.suppressions,
            now,
            email_statuses.SUMMARISE,
            outbox.queue,
        )
