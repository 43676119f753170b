"""Agent sends: a preview first, then `confirm` with its one-time token.

Every send an agent asks for (one email, from a template or not; a retry; a broadcast to a
contact list) is first a preview: how many recipients it reaches and the first of them, the
subject as rendered for that recipient, and what validation finds. Under the `send` policy
and within the workspace's recipient cap, the preview carries a one-time token bound to the
exact action (confirmations.py). Only `confirm` with the token performs the action, through
the same engine function the API uses, which enforces every sending rule again; the policy
and the cap are checked again too, since either may have changed since the preview.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import UTC
from typing import Any

from engine.addresses import normalize_email
from engine.agents import confirmations
from engine.agents.confirmations import Issued
from engine.agents.policy import SEND, McpPolicy, check_cap, require
from engine.contacts import bulk_send
from engine.contacts.bulk_send import BulkSendRequest, BulkSendResult
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sending import email_log, intake, statuses
from engine.sending.intake import AttachmentIn, Issue, Mailbox, SendRequest, SendResult
from engine.templates.variables import contact_values, render_subject
from storage import contacts, suppressions
from storage.codec import parse_optional_timestamp, timestamp
from storage.tx import Tx

SEND_EMAIL, RETRY_EMAIL, SEND_BROADCAST = "send_email", "retry_email", "send_broadcast"
# The email log's `source` of emails sent through the MCP door.
SOURCE = "mcp"
# Contacts looked at to find the first one a broadcast reaches (skipping suppressed ones).
FIRST_SCAN = 100


@dataclass(frozen=True, slots=True)
class Preview:
    action: str
    recipient_count: int
    first_recipient: str | None
    subject: str  # as rendered for the first recipient
    issues: list[Issue]  # what validation found (single emails)
    max_recipients: int
    # None: not confirmable (the policy is not `send`, or validation found errors).
    confirmation: Issued | None


@dataclass(frozen=True, slots=True)
class Confirmed:
    action: str
    email: SendResult | None = None
    broadcast: BulkSendResult | None = None


def _recipients(boxes: list[Mailbox]) -> list[str]:
    """Distinct addresses, normalised as sending stores them, in order (to, cc, bcc)."""
    found: dict[str, None] = {}
    for box in boxes:
        try:
            found[normalize_email(box.email)] = None
        except Unprocessable:  # validation reports it; counted as written
            found[box.email.strip().lower()] = None
    return list(found)


async def _confirmable(
    rt: Runtime, who: Principal, policy: McpPolicy, action: str, payload: dict[str, Any], n: int
) -> Issued:
    require(policy, SEND)
    check_cap(policy, n)
    return await confirmations.issue(rt, who, action, payload, n)


def _request_payload(req: SendRequest) -> dict[str, Any]:
    payload = asdict(req)
    if req.send_at is not None:  # a time without a zone is UTC, as sending reads it
        at = req.send_at if req.send_at.tzinfo else req.send_at.replace(tzinfo=UTC)
        payload["send_at"] = timestamp(at)
    return payload


def _request_from(payload: dict[str, Any]) -> SendRequest:
    def box(entry: dict[str, Any]) -> Mailbox:
        return Mailbox(entry["email"], entry["name"])

    fields = dict(payload)
    fields.update(
        from_=box(payload["from_"]),
        to=tuple(box(b) for b in payload["to"]),
        cc=tuple(box(b) for b in payload["cc"]),
        bcc=tuple(box(b) for b in payload["bcc"]),
        reply_to=None if payload["reply_to"] is None else box(payload["reply_to"]),
        tags=tuple(payload["tags"]),
        send_at=parse_optional_timestamp(payload["send_at"]),
        attachments=tuple(AttachmentIn(**a) for a in payload["attachments"]),
    )
    return SendRequest(**fields)


async def preview_email(
    rt: Runtime, who: Principal, policy: McpPolicy, req: SendRequest
) -> Preview:
    """Preview one email (already filled from its template); confirmable when it is valid.
    Forbidden unless the policy is `send` and the recipients are within its cap."""
    require(policy, SEND)
    recipients = _recipients([*req.to, *req.cc, *req.bcc])
    check_cap(policy, len(recipients))
    checked = await intake.validate(rt, who, req)
    confirmation = None
    # A confirmation keeps the request: for an erased recipient it would write the address
    # back, to send what is refused anyway (validation lists the recipient as suppressed).
    erased = await rt.db.read(suppressions.erased_among, who.workspace_id, recipients)
    if checked.valid and not erased:
        payload = _request_payload(req)
        confirmation = await _confirmable(rt, who, policy, SEND_EMAIL, payload, len(recipients))
    return Preview(
        SEND_EMAIL,
        len(recipients),
        recipients[0] if recipients else None,
        req.subject,
        checked.issues,
        policy.max_recipients,
        confirmation,
    )


async def preview_retry(rt: Runtime, who: Principal, policy: McpPolicy, email_id: str) -> Preview:
    """Preview sending a bounced, rejected or failed email again (email_log.retry)."""
    require(policy, SEND)
    email = (await email_log.detail(rt, who, email_id)).email
    if email.status not in statuses.RETRYABLE:  # the rule email_log.retry applies again
        raise Conflict(
            f"only bounced, rejected or failed emails can be retried; this one is {email.status}",
            code="not_retryable",
        )
    boxes = [Mailbox(str(e["email"])) for e in (*email.to, *email.cc, *email.bcc)]
    recipients = _recipients(boxes)
    confirmation = await _confirmable(
        rt, who, policy, RETRY_EMAIL, {"email_id": email.id}, len(recipients)
    )
    return Preview(
        RETRY_EMAIL,
        len(recipients),
        recipients[0] if recipients else None,
        email.subject,
        [],
        policy.max_recipients,
        confirmation,
    )


@dataclass(frozen=True, slots=True)
class _Audience:
    recipients: int
    first: contacts.Recipient | None


def _audience(tx: Tx, workspace_id: str, list_id: str) -> _Audience:
    found = contacts.get_list(tx, workspace_id, list_id)
    if found is None:
        raise NotFound("contact list not found")
    scanned = contacts.recipients_after(tx, workspace_id, list_id, -1, FIRST_SCAN)
    first = next((r for r in scanned if r.suppressed is None), None)
    return _Audience(bulk_send.audience(tx, workspace_id, found), first)


def _broadcast_payload(req: BulkSendRequest) -> dict[str, Any]:
    return asdict(req)


def _broadcast_from(payload: dict[str, Any]) -> BulkSendRequest:
    return BulkSendRequest(**{**payload, "tags": tuple(payload["tags"])})


async def preview_broadcast(
    rt: Runtime, who: Principal, policy: McpPolicy, req: BulkSendRequest, *, confirmable: bool
) -> Preview:
    """Preview a send to every contact of a list; with `confirmable`, Forbidden unless the
    policy is `send` and the list is within its cap. The sender, the plan's volume and the
    rest are checked by `confirm`, as the bulk send checks them."""
    bulk_send.check_request(req)
    audience = await rt.db.read(_audience, who.workspace_id, req.contact_list_id)
    first = audience.first
    subject = req.subject
    if first is not None:
        subject = render_subject(
            req.subject, contact_values(first.email, first.name, first.metadata)
        )
    confirmation = None
    if confirmable:
        payload = _broadcast_payload(req)
        confirmation = await _confirmable(
            rt, who, policy, SEND_BROADCAST, payload, audience.recipients
        )
    return Preview(
        SEND_BROADCAST,
        audience.recipients,
        None if first is None else first.email,
        subject,
        [],
        policy.max_recipients,
        confirmation,
    )


async def confirm(rt: Runtime, who: Principal, policy: McpPolicy, token: str) -> Confirmed:
    """Perform the action a preview's token confirms, once."""
    require(policy, SEND)
    pending = await confirmations.redeem(rt, who, policy, token)
    if pending.action == SEND_EMAIL:
        request = _request_from(pending.payload)
        sent = await intake.send(rt, who, request, source=SOURCE, logged=True)
        return Confirmed(SEND_EMAIL, email=sent)
    if pending.action == RETRY_EMAIL:
        retried = await email_log.retry(rt, who, pending.payload["email_id"], logged=True)
        return Confirmed(RETRY_EMAIL, email=retried)
    req = _broadcast_from(pending.payload)
    audience = await rt.db.read(_audience, who.workspace_id, req.contact_list_id)
    if audience.recipients != pending.recipients:
        raise Conflict(
            f"the list reaches {audience.recipients} recipients now, not the"
            f" {pending.recipients} previewed: preview it again",
            code="preview_outdated",
        )
    sent_to_list = await bulk_send.send_to_list(rt, who, req.contact_list_id, req)
    return Confirmed(SEND_BROADCAST, broadcast=sent_to_list)
