"""Reading the email log: lists, one email with its recipients and events, and retries."""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import Conflict, NotFound
from engine.runtime import Principal, Runtime
from engine.sending import AttachmentIn, Mailbox, SendRequest, SendResult, send
from storage import emails
from storage.emails import Email, Event, Recipient
from storage.tx import Tx

RETRYABLE = ("bounced", "rejected", "failed")


@dataclass(frozen=True, slots=True)
class EmailDetail:
    email: Email
    recipients: list[Recipient]
    events: list[Event]


async def page(
    rt: Runtime, who: Principal, status: str | None, page_number: int, limit: int
) -> list[Email]:
    return await rt.db.read(emails.page, who.workspace_id, status, page_number * limit, limit)


def _detail(tx: Tx, workspace_id: str, email_id: str) -> EmailDetail | None:
    email = emails.get(tx, workspace_id, email_id)
    if email is None:
        return None
    return EmailDetail(email, emails.recipients_of(tx, email_id), emails.events_of(tx, email_id))


async def detail(rt: Runtime, who: Principal, email_id: str) -> EmailDetail:
    found = await rt.db.read(_detail, who.workspace_id, email_id)
    if found is None:
        raise NotFound("email not found")
    return found


def _mailboxes(entries: list[dict[str, str | None]]) -> tuple[Mailbox, ...]:
    return tuple(Mailbox(str(e["email"]), e.get("name")) for e in entries)


async def retry(rt: Runtime, who: Principal, email_id: str) -> SendResult:
    """Send a bounced, rejected or failed email again as a new email linked to it."""
    original = (await detail(rt, who, email_id)).email
    if original.status not in RETRYABLE:
        raise Conflict(
            f"only bounced, rejected or failed emails can be retried; this one is {original.status}",
            code="not_retryable",
        )
    request = SendRequest(
        from_=Mailbox(original.from_address, original.from_name),
        to=_mailboxes(original.to),
        cc=_mailboxes(original.cc),
        bcc=_mailboxes(original.bcc),
        reply_to=None if original.reply_to is None else _mailboxes([original.reply_to])[0],
        subject=original.subject,
        html=original.html,
        text=original.text,
        headers=dict(original.headers),
        tags=tuple(original.tags),
        attachments=tuple(
            AttachmentIn(a["filename"], a["content_base64"], a["content_type"])
            for a in original.attachments
        ),
    )
    return await send(rt, who, request, source=original.source, retry_of_id=original.id)
