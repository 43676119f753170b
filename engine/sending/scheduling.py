"""Scheduled emails: list, cancel, and send now.

A scheduled email's recipients wait in the delivery queue with `next_attempt_at = send_at`;
the domain's queue sleeps until then. Sending now moves that time to now, after checking the
suppression list again (the address may have been suppressed since): a suppressed recipient
without an override makes the email `rejected` and the call a 422.
"""

from __future__ import annotations

from datetime import datetime

from engine.platform.errors import NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sending import intake as sending
from engine.sending import statuses
from engine.sending.intake import SendResult
from engine.sending.statuses import Trigger
from engine.suppressions import scopes
from engine.webhooks import outbox
from storage import emails, suppressions
from storage.codec import new_id
from storage.emails import Email, Event
from storage.tx import Tx


async def scheduled(rt: Runtime, who: Principal) -> list[Email]:
    return await rt.db.read(emails.scheduled, who.workspace_id)


def _cancel(tx: Tx, who: Principal, email_id: str, now: datetime) -> None:
    cancel = statuses.email_move(statuses.SCHEDULED, Trigger.CANCEL)
    recipients = statuses.recipients_move(Trigger.CANCEL)
    if not emails.cancel_scheduled(tx, who.workspace_id, email_id, now, cancel, recipients):
        raise NotFound("no scheduled email with this id")
    status = cancel.to
    outbox.record(tx, [Event(new_id(), email_id, who.workspace_id, status, None, {}, now)])


async def cancel(rt: Runtime, who: Principal, email_id: str) -> None:
    """Cancel a scheduled email; NotFound unless it is still scheduled."""
    await rt.db.write(_cancel, who, email_id, rt.clock.now())


def _send_now(tx: Tx, who: Principal, email_id: str, now: datetime) -> tuple[Email, str | None]:
    email = emails.get(tx, who.workspace_id, email_id)
    if email is None or email.status != statuses.SCHEDULED:
        raise NotFound("no scheduled email with this id")
    addresses = [r.address for r in emails.recipients_of(tx, email_id)]
    suppressed = scopes.blocking(
        suppressions.suppressed_among(tx, who.workspace_id, addresses), subscribed=email.unsubscribe
    )
    overrides = sending.suppression_overrides(tx, who.workspace_id, suppressed)
    rejection = sending.attempt_suppressed(tx, who.workspace_id, suppressed, overrides, now)
    if rejection is not None:
        reject = statuses.email_move(email.status, Trigger.SEND_NOW_SUPPRESSED)
        recipients = statuses.recipients_move(Trigger.CANCEL)
        emails.reject(tx, email_id, rejection, now, reject, recipients)
        meta = {"reason": rejection}
        status = reject.to
        outbox.record(tx, [Event(new_id(), email_id, who.workspace_id, status, None, meta, now)])
        return email, rejection
    due = statuses.email_move(email.status, Trigger.SEND_NOW)
    emails.make_due(tx, email_id, now, due, statuses.WAITING)
    return email, None


async def send_now(rt: Runtime, who: Principal, email_id: str) -> SendResult:
    """Dispatch a scheduled email at once; Unprocessable (after rejecting it) if suppressed."""
    email, rejection = await rt.db.write(_send_now, who, email_id, rt.clock.now())
    if rejection is not None:
        raise Unprocessable(rejection, code="recipient_suppressed")
    status = statuses.email_next(statuses.SCHEDULED, Trigger.SEND_NOW)
    return SendResult(email.id, status, email.message_id, None)
