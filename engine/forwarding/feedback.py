"""Recording bounce reports and complaints that arrived at an email's bounce address.

The email comes from the bounce address; only its own recipients are acted on, so a forged
report cannot suppress addresses the email was never sent to. The writes go through the
delivery engine's `record_outcomes`, and a failed DSN is read by the same classification as
a reply during the SMTP session (engine/delivery/classify.py): a recipient that is gone is
`bounced` (`email.bounced`) with a `hard_bounce` suppression; a full mailbox is `failed` and
counted toward a suppression like a mailbox-full reply (engine/delivery/full_mailboxes.py;
the reporting server already retried it); any other failure (the message, a policy) is
`failed` without suppression. A delayed DSN is recorded as a `deferred` event only; a
complaint writes `complained` and a `complaint` suppression, then asks the complaint-rate
guard (engine/contacts/complaint_guard.py) whether the domain's broadcasts must pause. Each
is recorded once.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

from engine.contacts import complaint_guard
from engine.delivery.classify import Replied, Verdict, classify
from engine.delivery.full_mailboxes import FullMailboxes
from engine.mail.reports import RecipientStatus, Report
from engine.platform.settings import ComplaintLimits
from engine.sending import statuses as email_statuses
from engine.sending.statuses import Trigger
from engine.smtp.replies import SmtpReply
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
        self.mailboxes = FullMailboxes()

    def event(self, kind: str, recipient: str, **meta: Any) -> None:
        metadata = {"subject": self.email.subject, "tags": self.email.tags, **meta}
        at = self.now + timedelta(microseconds=len(self.events))
        self.events.append(
            Event(new_id(), self.email.id, self.email.workspace_id, kind, recipient, metadata, at)
        )

    def move(self, address: str, current: str, trigger: Trigger, response: str) -> bool:
        """Move a recipient as the status table says; False when it is in no status the
        trigger moves from (the report changes only the events then)."""
        try:
            status = email_statuses.recipient_next(current, trigger)
        except ValueError:
            return False
        self.updates.append(RecipientUpdate(self.email.id, address, status, None, response))
        return True

    def suppress(self, address: str, reason: str) -> None:
        entry = Suppression(address, reason, self.now, self.email.id)
        self.suppressions.append((self.email.workspace_id, entry))


# "smtp; 550 5.1.1 <ann@example.com>: user unknown": the remote server's reply, typed.
_DIAGNOSTIC = re.compile(r"^(?:[\w-]+\s*;\s*)?([245]\d\d)[ -](.*)$")


def _reply(entry: RecipientStatus) -> SmtpReply:
    """The remote server's reply a DSN entry reports, with the DSN's status code when the
    diagnostic has none (or has no reply at all)."""
    found = _DIAGNOSTIC.match(entry.diagnostic or "")
    if found is not None and found[1][0] == entry.status[0]:
        code, text = int(found[1]), found[2]
    else:
        code = 550 if entry.permanent else 450
        text = (entry.diagnostic or "").partition(";")[2].strip() or (entry.diagnostic or "")
    reply = SmtpReply.of(code, text)
    if reply.enhanced_status is None:
        reply = SmtpReply.of(code, f"{entry.status} {text}".strip())
    return reply


def _dsn(changes: _Changes, statuses: dict[str, str], entries: tuple[RecipientStatus, ...]) -> None:
    for entry in entries:
        current = statuses.get(entry.recipient)
        if current is None or current in (email_statuses.BOUNCED, email_statuses.FAILED):
            continue
        response = entry.diagnostic or entry.status
        if not entry.permanent:
            if entry.delayed:
                changes.event("deferred", entry.recipient, dsn=entry.status, response=response)
            continue
        # The reply's own enhanced code when it has one (a Status of 5.0.0 often hides it).
        decision = classify(Replied(_reply(entry)))
        if decision.verdict is Verdict.BOUNCED:
            changes.event(
                "bounced", entry.recipient, dsn=decision.dsn, response=response, bounce_type="hard"
            )
            changes.move(entry.recipient, current, Trigger.PERMANENT, response)
            changes.suppress(entry.recipient, "hard_bounce")
            continue
        # Refused for the message or full: the reporting server already retried it.
        blame = None if decision.blame is None else decision.blame.value
        meta = {"dsn": decision.dsn, "response": response, "blame": blame}
        event = len(changes.events)
        changes.event("failed", entry.recipient, error=response, **meta)
        moved = changes.move(entry.recipient, current, Trigger.UNDELIVERABLE, response)
        if decision.verdict is Verdict.SOFT_BOUNCED:
            changes.events[event].metadata["bounce_type"] = "soft"
            update = len(changes.updates) - 1 if moved else None
            changes.mailboxes.note_full(
                changes.email.workspace_id,
                changes.email.id,
                entry.recipient,
                current,
                update,
                event,
            )


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


def record(tx: Tx, email: Email, report: Report, now: datetime, limits: ComplaintLimits) -> None:
    """Apply a DSN or complaint about one email, in the caller's transaction."""
    statuses = {r.address: r.status for r in emails.recipients_of(tx, email.id)}
    changes = _Changes(email, now)
    if report.kind == "dsn":
        _dsn(changes, statuses, report.statuses)
    else:
        _complaint(changes, statuses, report, tx)
    if changes.events:
        changes.mailboxes.settle(tx, changes.updates, changes.events, changes.suppressions, now)
        recorded = delivery.record_outcomes(
            tx,
            changes.updates,
            changes.events,
            changes.suppressions,
            now,
            email_statuses.SUMMARISE,
        )
        outbox.queue(tx, recorded)
        if report.kind != "dsn":
            complaint_guard.check(tx, email, now, limits)
