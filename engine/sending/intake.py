"""Accepting email: the rules of the send body, the plan, senders and suppressions.

`check` finds every problem with a send request without changing anything (the validate
endpoint shows them all); `send` raises the first one as the matching error, then stores the
email, its recipients and its first event in one durable unit of work before the caller
answers 202. Suppressed recipients do not make an error: the email is stored `rejected`, and
the one-time override (engine/suppressions/override.py) is applied in the same unit of work.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from engine import plans
from engine.addresses import normalize_email
from engine.errors import (
    EngineError,
    InvalidRequest,
    PayloadTooLarge,
    PlanFeature,
    PlanLimit,
    Unprocessable,
)
from engine.mail.addresses import message_id as new_message_id
from engine.mail.compose import header_text_problem, validate_custom_headers
from engine.runtime import Principal, Runtime
from engine.suppressions.override import OverrideState, Verdict, decide
from storage import domains, emails, suppressions
from storage.codec import new_id
from storage.emails import Email, Event, Recipient
from storage.tx import Tx

ATTACHMENT_LIMIT = 24 * 1024 * 1024  # per file and combined
SEND_AT_MIN = timedelta(minutes=1)
SEND_AT_MAX = timedelta(days=30)
FIELDS = ("account", "from", "limits", "to", "content")

Loc = tuple[str | int, ...]


@dataclass(frozen=True, slots=True)
class Mailbox:
    email: str
    name: str | None = None


@dataclass(frozen=True, slots=True)
class AttachmentIn:
    filename: str
    content_base64: str
    content_type: str = "application/octet-stream"


@dataclass(frozen=True, slots=True)
class SendRequest:
    from_: Mailbox
    to: tuple[Mailbox, ...]
    subject: str
    html: str | None = None
    text: str | None = None
    cc: tuple[Mailbox, ...] = ()
    bcc: tuple[Mailbox, ...] = ()
    reply_to: Mailbox | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    send_at: datetime | None = None
    attachments: tuple[AttachmentIn, ...] = ()


@dataclass(frozen=True, slots=True)
class Issue:
    """One problem with a send request, and the error that sending would raise for it."""

    field: str
    error: str
    # None: not an error (a suppressed recipient makes the email `rejected`, still a 202).
    raises: type[EngineError] | None = Unprocessable
    # Where in the body the problem is, when more precise than `field` (an error's `loc`).
    loc: Loc = ()


@dataclass(frozen=True, slots=True)
class SendResult:
    id: str
    status: str
    message_id: str
    rejection_reason: str | None


def _addresses(req: SendRequest, issues: list[Issue]) -> dict[str, list[Mailbox]] | None:
    """The request's recipients, normalised by kind; None (with issues) if any is invalid."""
    normalised: dict[str, list[Mailbox]] = {"to": [], "cc": [], "bcc": []}
    valid = True
    for kind, boxes in (("to", req.to), ("cc", req.cc), ("bcc", req.bcc)):
        for box in boxes:
            try:
                normalised[kind].append(Mailbox(normalize_email(box.email, kind), box.name))
            except Unprocessable as exc:
                issues.append(Issue("to", exc.detail))
                valid = False
    if not req.to:
        issues.append(Issue("to", "at least one `to` recipient is required"))
        valid = False
    return normalised if valid else None


def _decoded_attachments(req: SendRequest, issues: list[Issue]) -> list[bytes]:
    decoded: list[bytes] = []
    for attachment in req.attachments:
        if (
            any(bad in attachment.filename for bad in ("/", "\\", "\x00"))
            or not attachment.filename
        ):
            issues.append(
                Issue(
                    "content",
                    f"attachment filename {attachment.filename!r} may not contain /, \\ or NUL",
                )
            )
            continue
        try:
            content = base64.b64decode(attachment.content_base64, validate=True)
        except (binascii.Error, ValueError):
            issues.append(
                Issue(
                    "content",
                    f"attachment {attachment.filename!r} is not valid base64",
                    InvalidRequest,
                )
            )
            continue
        if len(content) > ATTACHMENT_LIMIT:
            issues.append(
                Issue(
                    "content", f"attachment {attachment.filename!r} is over 24 MiB", PayloadTooLarge
                )
            )
        decoded.append(content)
    if sum(len(c) for c in decoded) > ATTACHMENT_LIMIT:
        issues.append(Issue("content", "attachments are over 24 MiB combined", PayloadTooLarge))
    return decoded


def _header_texts(req: SendRequest) -> list[tuple[str, Loc, str | None]]:
    """Every text of a request that becomes (part of) a header line: (field, loc, text)."""
    texts: list[tuple[str, Loc, str | None]] = [
        ("content", ("subject",), req.subject),
        ("from", ("from_", "name"), req.from_.name),
    ]
    for kind, boxes in (("to", req.to), ("cc", req.cc), ("bcc", req.bcc)):
        texts.extend(("to", (kind, i, "name"), box.name) for i, box in enumerate(boxes))
    if req.reply_to is not None:
        texts.append(("from", ("reply_to", "name"), req.reply_to.name))
    texts.extend(("content", ("tags", i), tag) for i, tag in enumerate(req.tags))
    for i, attachment in enumerate(req.attachments):
        texts.append(("content", ("attachments", i, "filename"), attachment.filename))
        texts.append(("content", ("attachments", i, "content_type"), attachment.content_type))
    return texts


def _header_issues(req: SendRequest) -> list[Issue]:
    """Header text that compose would refuse at delivery (a line break would add a header
    of the caller's), and custom headers it would refuse, found before anything is queued."""
    issues: list[Issue] = []
    for field_name, loc, text in _header_texts(req):
        problem = None if text is None else header_text_problem(text)
        if problem is not None:
            where = ".".join(str(part) for part in loc)
            issues.append(Issue(field_name, f"{where} {problem}", loc=loc))
    for name, value in req.headers.items():
        issues.extend(
            Issue("content", problem, loc=("headers", name))
            for problem in validate_custom_headers({name: value})
        )
    return issues


def _request_issues(req: SendRequest, plan: plans.Plan, now: datetime) -> list[Issue]:
    """Problems that need no database: content, addresses, attachments, headers, send_at."""
    issues: list[Issue] = []
    try:
        normalize_email(req.from_.email, "from")
    except Unprocessable as exc:
        issues.append(Issue("from", exc.detail))
    _addresses(req, issues)
    if not (req.html or req.text):
        issues.append(Issue("content", "at least one of html or text is required"))
    issues.extend(_header_issues(req))
    _decoded_attachments(req, issues)
    if req.send_at is not None:
        send_at = req.send_at if req.send_at.tzinfo else req.send_at.replace(tzinfo=UTC)
        if not plan.scheduled_send:
            issues.append(
                Issue(
                    "account",
                    f"scheduled sending is not available on the {plan.name} plan",
                    PlanFeature,
                )
            )
        elif not now + SEND_AT_MIN <= send_at <= now + SEND_AT_MAX:
            issues.append(
                Issue(
                    "limits", "send_at must be between 1 minute and 30 days ahead", InvalidRequest
                )
            )
    return issues


def _month(now: datetime) -> str:
    return now.strftime("%Y-%m")


@dataclass(frozen=True, slots=True)
class _Context:
    """What the database says about a request: sender, volume, suppressions, overrides."""

    domain_id: str | None
    from_issue: str | None
    sent_this_month: int
    suppressed: dict[str, str]
    overrides: dict[str, OverrideState]


def _context(
    tx: Tx, workspace_id: str, from_email: str, recipients: list[str], now: datetime
) -> _Context:
    sender = domains.sender_by_email(tx, workspace_id, from_email)
    domain = None if sender is None else domains.get(tx, workspace_id, sender.domain_id)
    if sender is None or not sender.is_active:
        domain_id, from_issue = None, f"{from_email} is not a registered sender of this workspace"
    elif domain is None or domain.status != "verified":
        domain_id, from_issue = None, f"the domain of {from_email} is not verified"
    else:
        domain_id, from_issue = domain.id, None
    suppressed = suppressions.suppressed_among(tx, workspace_id, recipients)
    overrides = {
        email: OverrideState(rejected, used)
        for email, (rejected, used) in suppressions.overrides(
            tx, workspace_id, list(suppressed)
        ).items()
    }
    return _Context(
        domain_id,
        from_issue,
        emails.sent_in_month(tx, workspace_id, _month(now)),
        suppressed,
        overrides,
    )


def _context_issues(ctx: _Context, plan: plans.Plan) -> list[Issue]:
    issues: list[Issue] = []
    if ctx.from_issue is not None:
        issues.append(Issue("from", ctx.from_issue))
    if plan.emails_per_month != plans.UNLIMITED and ctx.sent_this_month >= plan.emails_per_month:
        issues.append(
            Issue(
                "limits",
                f"the {plan.name} plan allows {plan.emails_per_month} emails a month",
                PlanLimit,
            )
        )
    return issues


@dataclass(frozen=True, slots=True)
class Validation:
    valid: bool
    can_send: bool
    issues: list[Issue]


async def validate(rt: Runtime, who: Principal, req: SendRequest) -> Validation:
    """Every problem with a request, sending nothing and counting no override attempt."""
    now = rt.clock.now()
    plan = plans.plan(who.plan)
    issues = _request_issues(req, plan, now)
    recipients = _recipient_list(req)
    ctx = await rt.db.read(_context, who.workspace_id, _from_email(req), recipients, now)
    issues.extend(_context_issues(ctx, plan))
    for email, reason in ctx.suppressed.items():
        if decide(ctx.overrides.get(email), now) is not Verdict.ALLOW_ONCE:
            issues.append(Issue("to", f"{email} is suppressed ({reason})", raises=None))
    valid = all(issue.raises is None for issue in issues)
    return Validation(valid=valid, can_send=not issues, issues=issues)


def _from_email(req: SendRequest) -> str:
    try:
        return normalize_email(req.from_.email, "from")
    except Unprocessable:
        return req.from_.email


def _recipient_list(req: SendRequest) -> list[str]:
    issues: list[Issue] = []
    boxes = _addresses(req, issues) or {"to": [], "cc": [], "bcc": []}
    return list(dict.fromkeys(box.email for kind in ("to", "cc", "bcc") for box in boxes[kind]))


def _raise_first(issues: list[Issue]) -> None:
    for issue in issues:
        if issue.raises is not None:
            loc = ["body", *(issue.loc or (issue.field,))]
            error = issue.raises(issue.error, errors=[{"loc": loc, "msg": issue.error}])
            raise error


def attempt_suppressed(
    tx: Tx,
    workspace_id: str,
    suppressed: dict[str, str],
    overrides: dict[str, OverrideState],
    now: datetime,
) -> str | None:
    """Count an attempt to send to suppressed addresses; why it is rejected, or None.

    The email goes out only if every suppressed recipient has its override available; only
    then are those overrides used up. A first attempt opens each address's window.
    """
    rejection = None
    for email, reason in suppressed.items():
        verdict = decide(overrides.get(email), now)
        if verdict is Verdict.REJECT_AND_OPEN_WINDOW:
            suppressions.open_override_window(tx, workspace_id, email, now)
        if verdict is not Verdict.ALLOW_ONCE and rejection is None:
            rejection = (
                f"{email} is suppressed ({reason}); a retry within 24 hours of the first"
                " rejection is delivered once"
            )
    if rejection is None:
        for email in suppressed:
            suppressions.use_override(tx, workspace_id, email, now)
    return rejection


def suppression_overrides(
    tx: Tx, workspace_id: str, suppressed: dict[str, str]
) -> dict[str, OverrideState]:
    return {
        email: OverrideState(rejected, used)
        for email, (rejected, used) in suppressions.overrides(
            tx, workspace_id, list(suppressed)
        ).items()
    }


def _unique_addresses(boxes: dict[str, list[Mailbox]]) -> list[str]:
    return list(dict.fromkeys(box.email for kind in ("to", "cc", "bcc") for box in boxes[kind]))


def email_records(
    req: SendRequest,
    from_email: str,
    boxes: dict[str, list[Mailbox]],
    workspace_id: str,
    domain_id: str,
    now: datetime,
    *,
    source: str,
    rejection: str | None = None,
    retry_of_id: str | None = None,
) -> tuple[Email, list[Recipient], Event]:
    """The rows that store one accepted email: it, its recipients (none if rejected), its
    first event. `from_email` and `boxes` are already normalised; nothing is checked here."""
    recipients = _unique_addresses(boxes)
    email_id = new_id()
    status = "rejected" if rejection else "scheduled" if req.send_at else "queued"
    due = req.send_at or now
    record = Email(
        id=email_id,
        workspace_id=workspace_id,
        domain_id=domain_id,
        from_address=from_email,
        from_name=req.from_.name,
        to=[{"email": b.email, "name": b.name} for b in boxes["to"]],
        cc=[{"email": b.email, "name": b.name} for b in boxes["cc"]],
        bcc=[{"email": b.email, "name": b.name} for b in boxes["bcc"]],
        reply_to=None
        if req.reply_to is None
        else {"email": req.reply_to.email, "name": req.reply_to.name},
        subject=req.subject,
        html=req.html,
        text=req.text,
        headers=dict(req.headers),
        tags=list(req.tags),
        attachments=[
            {
                "filename": a.filename,
                "content_type": a.content_type,
                "content_base64": a.content_base64,
            }
            for a in req.attachments
        ],
        status=status,
        source=source,
        message_id=new_message_id(from_email.rsplit("@", 1)[1]),
        rejection_reason=rejection,
        retry_of_id=retry_of_id,
        send_at=req.send_at,
        created_at=now,
        updated_at=now,
        delivered_at=None,
    )
    kinds = {box.email: kind for kind in ("bcc", "cc", "to") for box in boxes[kind]}
    rows = (
        []
        if rejection
        else [
            Recipient(
                email_id,
                address,
                kinds[address],
                address.rsplit("@", 1)[1],
                "queued",
                0,
                due,
                None,
                now,
            )
            for address in recipients
        ]
    )
    meta: dict[str, Any] = {"subject": req.subject, "tags": list(req.tags)}
    if rejection:
        meta["reason"] = rejection
    # The first event is named as the status the email starts in: queued, scheduled, rejected.
    event = Event(new_id(), email_id, workspace_id, status, None, meta, now)
    return record, rows, event


def _store(
    tx: Tx,
    who: Principal,
    req: SendRequest,
    plan: plans.Plan,
    now: datetime,
    source: str,
    retry_of_id: str | None,
) -> SendResult:
    """Store the email (delivery hears of its recipient domains once it is committed)."""
    boxes = _addresses(req, []) or {"to": [], "cc": [], "bcc": []}
    recipients = _unique_addresses(boxes)
    from_email = _from_email(req)
    ctx = _context(tx, who.workspace_id, from_email, recipients, now)
    _raise_first(_context_issues(ctx, plan))
    assert ctx.domain_id is not None
    rejection = attempt_suppressed(tx, who.workspace_id, ctx.suppressed, ctx.overrides, now)
    record, rows, event = email_records(
        req,
        from_email,
        boxes,
        who.workspace_id,
        ctx.domain_id,
        now,
        source=source,
        rejection=rejection,
        retry_of_id=retry_of_id,
    )
    emails.insert(tx, [record], rows, [event])
    if not rejection:
        emails.count_sent(tx, who.workspace_id, _month(now), 1)
    return SendResult(record.id, record.status, record.message_id, rejection)


async def send(
    rt: Runtime,
    who: Principal,
    req: SendRequest,
    *,
    source: str = "api",
    retry_of_id: str | None = None,
) -> SendResult:
    """Accept an email: stored durably before this returns; delivery is woken."""
    now = rt.clock.now()
    plan = plans.plan(who.plan)
    _raise_first(_request_issues(req, plan, now))
    result: SendResult = await rt.db.write(_store, who, req, plan, now, source, retry_of_id)
    return result
