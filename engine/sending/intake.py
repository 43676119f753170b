"""Accepting email, for every door: the API (single and batch), bulk sends, the SMTP relay,
forwarded mail and the service's own mail.

The rules live here once each: the sender must be an active sender on a verified domain
(`verified_sender`), the plan's monthly volume must have room (`volume_problem`, counted in
the node's own shard by `store`), suppressed recipients and their one-time 24-hour override
(`attempt_suppressed`), and the rows an accepted email is stored as (`rows`, then `store`:
multi-row statements for any number of emails, one volume update per workspace, and the
wake-up of delivery on every node once committed).

For the API, `validate` finds every problem with a request without changing anything;
`send` raises the first one, then stores the email in one durable unit of work before the
caller answers 202; `send_many` stores a batch in one unit, each entry accepted or refused on
its own. A request's addresses are normalised once, before the unit of work. Suppressed
recipients do not make an error: the email is stored `rejected`.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import outcome

from engine import plans
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.domains.marketing import stopped_problem
from engine.mail.addresses import message_id as new_message_id
from engine.mail.compose import header_text_problem, validate_custom_headers
from engine.mail.unsubscribe_footer import VARIABLE, subject_problem
from engine.platform.errors import (
    EngineError,
    InvalidRequest,
    MarketingStopped,
    PayloadTooLarge,
    PlanFeature,
    PlanLimit,
    Unprocessable,
)
from engine.platform.runtime import Principal, Runtime
from engine.sending import statuses
from engine.sending.statuses import Trigger
from engine.suppressions import scopes
from engine.suppressions.override import FINAL, OverrideState, Verdict, decide
from engine.webhooks import outbox
from storage import domains, emails, privacy, suppressions
from storage.codec import new_id
from storage.domains import Domain, Sender
from storage.emails import Email, Event, Recipient
from storage.engines import runs_together
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
    # Carry List-Unsubscribe and `{{unsubscribe_url}}` (transactional mail does not unless
    # asked); such an email is not sent to an address that unsubscribed.
    unsubscribe: bool = False


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


def _request_issues(
    req: SendRequest, plan: plans.Plan, now: datetime
) -> tuple[list[Issue], _Addresses | None]:
    """Problems that need no database (content, addresses, attachments, headers, send_at),
    and the request's addresses normalised (None when one is not an address)."""
    issues: list[Issue] = []
    addresses = _normalised(req, issues)
    if not (req.html or req.text):
        issues.append(Issue("content", "at least one of html or text is required"))
    if not req.unsubscribe and any(VARIABLE.search(part or "") for part in (req.html, req.text)):
        # Filled only in mail that offers unsubscribe: it would go out as the braces.
        issues.append(
            Issue(
                "content",
                "the body places {{unsubscribe_url}}: send it with unsubscribe set to true",
                loc=("unsubscribe",),
            )
        )
    if problem := subject_problem(req.subject):
        issues.append(Issue("subject", problem))
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
    return issues, addresses


def month(now: datetime) -> str:
    """The calendar month the volume of `now` counts in ('YYYY-MM', UTC)."""
    return now.strftime("%Y-%m")


# -- the rules every door applies --------------------------------------------------------------


def verified_sender(tx: Tx, sender: Sender | None) -> Domain | str:
    """The sending domain of an active sender on a verified domain; else why not."""
    if sender is None or not sender.is_active:
        return "is not a registered sender of this workspace"
    domain = domains.get(tx, sender.workspace_id, sender.domain_id)
    if domain is None or domain.status != "verified":
        return "is not on a verified domain"
    return domain


# A write adding more than UNLOCKED_ADD emails, or ending within NEAR_LIMIT of the plan's
# monthly volume, takes the workspace's volume lock (`counted_volume`). Unlocked writes on
# different nodes could then overshoot only if thousands of them ran at once.
UNLOCKED_ADD = 100
NEAR_LIMIT = 10_000


def counted_volume(
    tx: Tx, workspace_id: str, now: datetime, shard: int, plan: plans.Plan, adding: int
) -> int:
    """The workspace's volume this month, for a write about to add `adding` emails in `shard`.

    Each node counts in its own shard and never waits on the others' (`emails.sent_in_month`),
    so two nodes with room for one more email would each see it and send one: near the
    plan's limit, or adding many at once, the write first takes the workspace's volume lock
    (`emails.hold_volume`), and reads the volume again with it held, so such writes take
    turns across nodes and each sees the others' counts."""
    used = emails.sent_in_month(tx, workspace_id, month(now), shard)
    limit = plan.emails_per_month
    if limit == plans.UNLIMITED or (adding <= UNLOCKED_ADD and used + adding <= limit - NEAR_LIMIT):
        return used
    emails.hold_volume(tx, workspace_id)
    return emails.sent_in_month(tx, workspace_id, month(now))


def volume_problem(plan: plans.Plan, used: int, adding: int = 1) -> str | None:
    """Why `adding` more emails do not fit the plan's monthly volume, or None."""
    if plan.emails_per_month == plans.UNLIMITED or used + adding <= plan.emails_per_month:
        return None
    return f"the {plan.name} plan allows {plan.emails_per_month} emails a month"


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
        verdict = decide(overrides.get(email), now, reason)
        if verdict is Verdict.REJECT_AND_OPEN_WINDOW:
            suppressions.open_override_window(tx, workspace_id, email, now)
        if verdict is not Verdict.ALLOW_ONCE and rejection is None:
            rejection = _rejection(email, reason)
    if rejection is None:
        for email in suppressed:
            suppressions.use_override(tx, workspace_id, email, now)
    return rejection


def _rejection(email: str, reason: str) -> str:
    if reason == suppressions.ERASED:
        return "a recipient is suppressed: its address was erased on request and is never sent to again"
    if reason in FINAL:
        return (
            f"{email} is suppressed ({reason}): the recipient's own request, which no retry"
            " overrides; only removing it from the suppression list lifts it"
        )
    return (
        f"{email} is suppressed ({reason}); a retry within 24 hours of the first rejection"
        " is delivered once"
    )


def suppression_overrides(
    tx: Tx, workspace_id: str, suppressed: dict[str, str]
) -> dict[str, OverrideState]:
    return {
        email: OverrideState(rejected, used)
        for email, (rejected, used) in suppressions.overrides(
            tx, workspace_id, list(suppressed)
        ).items()
    }


# -- the rows an accepted email is stored as ------------------------------------------------


@dataclass(frozen=True, slots=True)
class NewEmail:
    """An email as any door hands it in to be stored: addresses normalised, rules applied."""

    workspace_id: str
    domain_id: str
    domain_name: str
    from_email: str
    from_name: str | None
    to: tuple[Mailbox, ...]
    subject: str
    source: str
    cc: tuple[Mailbox, ...] = ()
    bcc: tuple[Mailbox, ...] = ()
    reply_to: Mailbox | None = None
    html: str | None = None
    text: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    tags: tuple[str, ...] = ()
    attachments: tuple[AttachmentIn, ...] = ()
    send_at: datetime | None = None
    retry_of_id: str | None = None
    rejection: str | None = None
    raw: bytes | None = None  # sent as given (relay, forwards)
    message_id: str | None = None  # the given message's own, if it has one
    unsubscribe: bool = False  # carries List-Unsubscribe (engine/suppressions/scopes.py)
    broadcast_id: str | None = None  # one of a bulk send's emails
    requiretls: bool = False  # delivered only under verified TLS (RFC 8689)
    # A message sent as given goes to its envelope recipients, whoever its header names.
    envelope: tuple[str, ...] = ()


def _boxes(boxes: tuple[Mailbox, ...]) -> list[dict[str, str | None]]:
    return [{"email": box.email, "name": box.name} for box in boxes]


def rows(new: NewEmail, now: datetime) -> tuple[Email, list[Recipient], Event]:
    """The email, its recipients (none if rejected) and its first event."""
    email_id = new_id()
    trigger = (
        Trigger.ACCEPT_SUPPRESSED
        if new.rejection
        else Trigger.ACCEPT_SCHEDULED
        if new.send_at
        else Trigger.ACCEPT
    )
    status = statuses.email_next(None, trigger)
    due = new.send_at or now
    kinds = {box.email: kind for kind in ("bcc", "cc", "to") for box in getattr(new, kind)}
    recipients = list(dict.fromkeys(new.envelope or kinds))
    record = Email(
        id=email_id,
        workspace_id=new.workspace_id,
        domain_id=new.domain_id,
        from_address=new.from_email,
        from_name=new.from_name,
        to=_boxes(new.to),
        cc=_boxes(new.cc),
        bcc=_boxes(new.bcc),
        reply_to=None if new.reply_to is None else _boxes((new.reply_to,))[0],
        subject=new.subject,
        html=new.html,
        text=new.text,
        headers=dict(new.headers),
        tags=list(new.tags),
        attachments=[
            {
                "filename": a.filename,
                "content_type": a.content_type,
                "content_base64": a.content_base64,
            }
            for a in new.attachments
        ],
        status=status,
        source=new.source,
        message_id=new.message_id or new_message_id(new.domain_name),
        rejection_reason=new.rejection,
        retry_of_id=new.retry_of_id,
        send_at=new.send_at,
        created_at=now,
        updated_at=now,
        delivered_at=None,
        raw=new.raw,
        unsubscribe=new.unsubscribe,
        requiretls=new.requiretls,
        broadcast_id=new.broadcast_id,
    )
    recipient_rows = (
        []
        if new.rejection
        else [
            Recipient(
                email_id,
                address,
                kinds.get(address, "bcc"),
                address.rsplit("@", 1)[1],
                statuses.QUEUED,
                0,
                due,
                None,
                now,
            )
            for address in recipients
        ]
    )
    meta: dict[str, Any] = {"subject": new.subject, "tags": list(new.tags)}
    if new.rejection:
        meta["reason"] = new.rejection
    if new.raw is not None:
        meta["source"] = new.source
    # The first event is named as the status the email starts in: queued, scheduled, rejected.
    event = Event(new_id(), email_id, new.workspace_id, status, None, meta, now)
    return record, recipient_rows, event


def _without_erased(tx: Tx, new: NewEmail) -> NewEmail:
    """A refused email as it may be stored: every address on it that was erased replaced by
    its placeholder, wherever the sender wrote it (a refused send must not write back what
    an erasure took out)."""
    recipients = {box.email for box in (*new.to, *new.cc, *new.bcc)} | set(new.envelope)
    for address in suppressions.erased_among(tx, new.workspace_id, sorted(recipients)):
        hashed = privacy.address_hash(tx, new.workspace_id, address)
        new = _rewritten(new, privacy.rewriter(privacy.placeholder(hashed), address))
    return new


def _rewritten(new: NewEmail, rewrite: privacy.Rewrite) -> NewEmail:
    def boxes(found: tuple[Mailbox, ...]) -> tuple[Mailbox, ...]:
        return tuple(Mailbox(rewrite(box.email), rewrite(box.name)) for box in found)

    return replace(
        new,
        to=boxes(new.to),
        cc=boxes(new.cc),
        bcc=boxes(new.bcc),
        reply_to=None if new.reply_to is None else boxes((new.reply_to,))[0],
        from_name=rewrite(new.from_name),
        subject=rewrite(new.subject),
        html=rewrite(new.html),
        text=rewrite(new.text),
        headers={name: rewrite(value) for name, value in new.headers.items()},
        tags=tuple(rewrite(tag) for tag in new.tags),
        attachments=tuple(
            replace(
                a,
                filename=rewrite(a.filename),
                content_base64=privacy.rewrite_base64(a.content_base64, rewrite),
            )
            for a in new.attachments
        ),
        raw=rewrite(new.raw),
        envelope=tuple(rewrite(address) for address in new.envelope),
        rejection=rewrite(new.rejection),
    )


def store(
    tx: Tx,
    new: Sequence[NewEmail],
    now: datetime,
    *,
    volume_shard: int | None,
    announce: bool = True,
) -> list[Email]:
    """Store accepted emails in the caller's unit of work, in multi-row statements; count
    them in the monthly volume, one update per workspace in the node's `volume_shard` (None:
    not counted: the caller reserved the volume, or it is the service's own mail); delivery
    hears of them once committed unless `announce` is off."""
    built = [rows(_without_erased(tx, item) if item.rejection else item, now) for item in new]
    records = [email for email, _, _ in built]
    events = [event for _, _, event in built]
    with tx.pipeline():  # one round trip for the rows of every table, the outbox's too
        emails.insert(
            tx,
            records,
            [r for _, recipients, _ in built for r in recipients],
            events,
            announce=announce,
        )
        outbox.queue(tx, events)
    for email in records:
        if email.raw is not None:
            emails.insert_raw(tx, email.id, email.raw)
    if volume_shard is not None:
        sent: dict[str, int] = {}
        for email in records:
            if email.rejection_reason is None:
                sent[email.workspace_id] = sent.get(email.workspace_id, 0) + 1
        for workspace_id, count in sent.items():
            emails.count_sent(tx, workspace_id, month(now), count, volume_shard)
    return records


# -- the API: a send request -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Addresses:
    """A request's addresses, normalised once."""

    from_email: str
    to: tuple[Mailbox, ...]
    cc: tuple[Mailbox, ...]
    bcc: tuple[Mailbox, ...]
    # The request offers an unsubscribe: an unsubscribed address blocks it (scopes.py).
    subscribed: bool = False

    @property
    def recipients(self) -> list[str]:
        return list(dict.fromkeys(b.email for b in (*self.to, *self.cc, *self.bcc)))


def _normalised(req: SendRequest, issues: list[Issue]) -> _Addresses | None:
    """The request's addresses normalised; None (with issues) if one is not an address."""
    before = len(issues)
    try:
        from_email = normalize_email(req.from_.email, "from")
    except Unprocessable as exc:
        issues.append(Issue("from", exc.detail))
        from_email = req.from_.email
    kinds: dict[str, list[Mailbox]] = {"to": [], "cc": [], "bcc": []}
    for kind, boxes in (("to", req.to), ("cc", req.cc), ("bcc", req.bcc)):
        for box in boxes:
            try:
                kinds[kind].append(Mailbox(normalize_email(box.email, kind), box.name))
            except Unprocessable as exc:
                issues.append(Issue("to", exc.detail))
    if not req.to:
        issues.append(Issue("to", "at least one `to` recipient is required"))
    if len(issues) > before:
        return None
    return _Addresses(
        from_email,
        tuple(kinds["to"]),
        tuple(kinds["cc"]),
        tuple(kinds["bcc"]),
        req.unsubscribe,
    )


@dataclass(frozen=True, slots=True)
class _Context:
    """What the database says about a request: sender, volume, suppressions, overrides."""

    domain: Domain | None
    from_issue: str | None
    sent_this_month: int
    suppressed: dict[str, str]
    overrides: dict[str, OverrideState]
    # Why its mail, which offers unsubscribe, is refused: the domain's marketing is stopped.
    stopped: str | None = None


def _context(tx: Tx, workspace_id: str, addresses: _Addresses, now: datetime) -> _Context:
    [ctx] = _contexts(tx, workspace_id, [addresses], now)
    return ctx


def _contexts(
    tx: Tx,
    workspace_id: str,
    many: Sequence[_Addresses],
    now: datetime,
    counting: tuple[int, plans.Plan] | None = None,
) -> list[_Context]:
    """The contexts of a request or a batch, set-based: each distinct sender looked up once,
    the recipients' suppressions in one query, the volume once (for a write that counts in
    a shard under a plan, `counting`: `counted_volume`)."""
    senders: dict[str, tuple[Domain | None, str | None]] = {}
    for from_email in dict.fromkeys(a.from_email for a in many):
        found = verified_sender(tx, domains.sender_by_email(tx, workspace_id, from_email))
        senders[from_email] = (
            (found, None) if isinstance(found, Domain) else (None, f"{from_email} {found}")
        )
    everyone = list(dict.fromkeys(r for a in many for r in a.recipients))
    suppressed = suppressions.suppressed_among(tx, workspace_id, everyone)
    overrides = suppression_overrides(tx, workspace_id, suppressed)
    sent = (
        emails.sent_in_month(tx, workspace_id, month(now))
        if counting is None
        else counted_volume(tx, workspace_id, now, *counting, len(many))
    )
    contexts = []
    for a in many:
        mine = scopes.blocking(
            {r: suppressed[r] for r in a.recipients if r in suppressed}, subscribed=a.subscribed
        )
        contexts.append(
            _Context(
                *senders[a.from_email],
                sent,
                mine,
                {r: overrides[r] for r in mine if r in overrides},
                _stopped(senders[a.from_email][0], a.subscribed),
            )
        )
    return contexts


def _stopped(domain: Domain | None, subscribed: bool) -> str | None:
    if domain is None or not subscribed:
        return None
    return stopped_problem(domain)


def _context_issues(ctx: _Context, plan: plans.Plan, adding: int = 1) -> list[Issue]:
    issues: list[Issue] = []
    if ctx.from_issue is not None:
        issues.append(Issue("from", ctx.from_issue))
    if ctx.stopped is not None:
        issues.append(Issue("unsubscribe", ctx.stopped, MarketingStopped))
    problem = volume_problem(plan, ctx.sent_this_month, adding)
    if problem is not None:
        issues.append(Issue("limits", problem, PlanLimit))
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
    issues, addresses = _request_issues(req, plan, now)
    if addresses is not None:
        ctx = await rt.db.read(_context, who.workspace_id, addresses, now)
        issues.extend(_context_issues(ctx, plan))
        for email, reason in ctx.suppressed.items():
            if decide(ctx.overrides.get(email), now, reason) is not Verdict.ALLOW_ONCE:
                issues.append(Issue("to", f"{email} is suppressed ({reason})", raises=None))
    valid = all(issue.raises is None for issue in issues)
    return Validation(valid=valid, can_send=not issues, issues=issues)


def _raise_first(issues: list[Issue]) -> None:
    for issue in issues:
        if issue.raises is not None:
            loc = ["body", *(issue.loc or (issue.field,))]
            error = issue.raises(issue.error, errors=[{"loc": loc, "msg": issue.error}])
            raise error


@dataclass(frozen=True, slots=True)
class _Checked:
    """A request that passed the checks needing no database, and where it came from."""

    req: SendRequest
    addresses: _Addresses
    source: str = "api"
    retry_of_id: str | None = None


def _checked(
    req: SendRequest,
    plan: plans.Plan,
    now: datetime,
    source: str = "api",
    retry_of_id: str | None = None,
) -> _Checked:
    issues, addresses = _request_issues(req, plan, now)
    _raise_first(issues)
    assert addresses is not None
    return _Checked(req, addresses, source, retry_of_id)


def _accepted(
    tx: Tx,
    who: Principal,
    checked: _Checked,
    ctx: _Context,
    plan: plans.Plan,
    now: datetime,
    *,
    adding: int,
) -> NewEmail:
    """Apply the database's rules to a checked request: the email to store, or the error."""
    addresses = checked.addresses
    _raise_first(_context_issues(ctx, plan, adding))
    assert ctx.domain is not None
    req = checked.req
    return NewEmail(
        workspace_id=who.workspace_id,
        domain_id=ctx.domain.id,
        domain_name=ctx.domain.name,
        from_email=addresses.from_email,
        from_name=req.from_.name,
        to=addresses.to,
        cc=addresses.cc,
        bcc=addresses.bcc,
        reply_to=req.reply_to,
        subject=req.subject,
        html=req.html,
        text=req.text,
        headers=req.headers,
        tags=req.tags,
        attachments=req.attachments,
        send_at=req.send_at,
        source=checked.source,
        retry_of_id=checked.retry_of_id,
        unsubscribe=req.unsubscribe,
        rejection=attempt_suppressed(tx, who.workspace_id, ctx.suppressed, ctx.overrides, now),
    )


def _result(email: Email) -> SendResult:
    return SendResult(email.id, email.status, email.message_id, email.rejection_reason)


def _store_singles(tx: Tx, calls: list[tuple[Any, ...]]) -> list[outcome.Outcome[SendResult]]:
    """Single sends that met in one group commit, stored as one batch per workspace: a
    handful of statements in all instead of some ten each. Their time is the latest of
    theirs (they are stored together); each is refused or accepted as it would be alone."""
    now = max(call[3] for call in calls)
    workspaces: dict[tuple[str, str], list[int]] = {}
    for i, (who, _, plan, _, _) in enumerate(calls):
        workspaces.setdefault((who.workspace_id, plan.name), []).append(i)
    results: dict[int, outcome.Outcome[SendResult]] = {}
    for members in workspaces.values():
        who, _, plan, _, shard = calls[members[0]]
        stored = _store_many(tx, who, [calls[i][1] for i in members], plan, now, shard)
        for i, result in zip(members, stored, strict=True):
            results[i] = (
                outcome.Error(result) if isinstance(result, EngineError) else outcome.Value(result)
            )
    return [results[i] for i in range(len(calls))]


@runs_together(_store_singles)
def _store_one(
    tx: Tx, who: Principal, checked: _Checked, plan: plans.Plan, now: datetime, shard: int
) -> SendResult:
    [result] = _store_many(tx, who, [checked], plan, now, shard)
    if isinstance(result, EngineError):
        raise result
    return result


def _store_one_logged(
    tx: Tx, who: Principal, checked: _Checked, plan: plans.Plan, now: datetime, shard: int
) -> SendResult:
    """`_store_one` and the email's activity entry (`email.sent`), in one unit of work that
    runs alone, in its caller's context (so the entry says which door and client sent it)."""
    result = _store_one(tx, who, checked, plan, now, shard)
    addresses = checked.addresses
    boxes = (*addresses.to, *addresses.cc, *addresses.bcc)
    meta: dict[str, Any] = {
        "status": result.status,
        "recipients": len({box.email for box in boxes}),
        "source": checked.source,
    }
    if checked.retry_of_id is not None:
        meta["retry_of_id"] = checked.retry_of_id
    subject = checked.req.subject or "(no subject)"
    record(
        tx, who.workspace_id, who.user_email, Change("email.sent", subject, result.id, meta), now
    )
    return result


async def send(
    rt: Runtime,
    who: Principal,
    req: SendRequest,
    *,
    source: str = "api",
    retry_of_id: str | None = None,
    logged: bool = False,
) -> SendResult:
    """Accept an email: stored durably before this returns; delivery is woken. With
    `logged`, the email writes its own activity entry: the emails an agent sends one by one
    (the API's and the relay's are too many to log each; docs/architecture.md section 7)."""
    now = rt.clock.now()
    plan = plans.plan(who.plan)
    checked = _checked(req, plan, now, source, retry_of_id)
    unit = _store_one_logged if logged else _store_one
    result: SendResult = await rt.db.write(unit, who, checked, plan, now, rt.usage_shard)
    return result


def _store_many(
    tx: Tx,
    who: Principal,
    entries: Sequence[_Checked | EngineError],
    plan: plans.Plan,
    now: datetime,
    shard: int,
) -> list[SendResult | EngineError]:
    """A batch in one unit: each entry accepted or refused on its own, the accepted ones
    stored together (no unit per entry)."""
    accepted: list[NewEmail] = []
    placed: list[int | EngineError] = []
    sent = 0  # accepted so far, not rejected
    checked = [e for e in entries if not isinstance(e, EngineError)]
    addresses = [c.addresses for c in checked]
    contexts = iter(_contexts(tx, who.workspace_id, addresses, now, (shard, plan)))
    for entry in entries:
        if isinstance(entry, EngineError):
            placed.append(entry)
            continue
        ctx = next(contexts)
        if ctx.suppressed:
            # Overrides change as entries use them: read them afresh (rare: suppressed).
            ctx = _context(tx, who.workspace_id, entry.addresses, now)
        try:
            # An entry counts against the volume with the batch's earlier ones.
            new = _accepted(tx, who, entry, ctx, plan, now, adding=1 + sent)
        except EngineError as exc:
            placed.append(exc)
            continue
        sent += new.rejection is None
        placed.append(len(accepted))
        accepted.append(new)
    stored = store(tx, accepted, now, volume_shard=shard)
    return [p if isinstance(p, EngineError) else _result(stored[p]) for p in placed]


async def send_many(
    rt: Runtime, who: Principal, requests: list[SendRequest], *, source: str = "batch"
) -> list[SendResult | EngineError]:
    """Accept a batch: each request's result, or the error that refused it, in order."""
    now = rt.clock.now()
    plan = plans.plan(who.plan)
    entries: list[_Checked | EngineError] = []
    for req in requests:
        try:
            entries.append(_checked(req, plan, now, source))
        except EngineError as exc:
            entries.append(exc)
    results: list[SendResult | EngineError] = await rt.db.write(
        _store_many, who, entries, plan, now, rt.usage_shard
    )
    return results
