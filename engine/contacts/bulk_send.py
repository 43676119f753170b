"""Bulk send: one personalised email per contact of a list, recorded as a broadcast.

Rules (spec: Contacts, bulk send body):
- `contact_list_id` must equal the list in the URL (400); an unknown list, or a sender that
  is unknown, inactive or not on a verified domain, is 404; an empty list is 400.
- Subject, html and text are rendered per contact with `engine.variables` (`{{email}}`,
  `{{name}}`, `{{<metadata key>}}`; unknown ones render empty, values HTML-escaped in html).
- Contacts whose address is suppressed (any reason) or not a plausible address are skipped
  and named in `errors`; the suppression override of single sends does not apply here.
- The plan's monthly volume is checked once for the whole send: if the contacts to be sent
  to do not fit in what is left of the month, nothing is sent (403 plan_limit).

The broadcast row and the volume reservation are written first; then the list is walked in
`seq` order, CHUNK contacts per transaction of multi-row inserts (the same rows a single send
stores, built by `intake.store`); finally the broadcast becomes `sent` (or `failed`
when nothing was queued), the volume is corrected to what was actually queued, and delivery
is woken. Each chunk also adds its counts to the broadcast, so its progress shows in
`GET /v1/broadcasts/`. The walk is shielded from cancellation: once started it finishes. A
broadcast left `sending` by a node that died is failed by `fail_interrupted` when that node
starts again (or after STALE_AFTER without progress, by any node's start).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

import trio

from engine import plans
from engine.activity import Change, record
from engine.contacts import complaint_guard
from engine.contacts.lists import CappedErrors
from engine.domains.marketing import stopped_problem
from engine.mail import list_headers
from engine.mail.compose import header_text_problem
from engine.mail.unsubscribe_footer import subject_problem
from engine.platform.errors import Conflict, InvalidRequest, NotFound, PlanLimit, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sending import intake
from engine.sending.intake import Mailbox, NewEmail
from engine.templates.variables import contact_values, render, render_subject
from storage import broadcasts, contacts, domains, emails
from storage.broadcasts import Broadcast
from storage.codec import new_id
from storage.contacts import ContactList
from storage.domains import Domain, Sender
from storage.tx import Tx

CHUNK = 1_000
# A broadcast that made no progress for this long was left by a node that died.
STALE_AFTER = timedelta(minutes=10)


@dataclass(frozen=True, slots=True)
class BulkSendRequest:
    contact_list_id: str
    sender_address_id: str
    subject: str
    html: str | None = None
    text: str | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class BulkSendResult:
    broadcast_id: str
    queued: int
    skipped: int
    errors: list[str]


@dataclass(frozen=True, slots=True)
class _Started:
    broadcast: Broadcast
    sender: Sender


@dataclass(frozen=True, slots=True)
class _Chunk:
    """What one transaction of the walk did."""

    last_seq: int | None  # None: the list had no contacts left
    queued: int
    skipped: list[str]  # why each skipped contact was skipped
    domains: list[str]  # recipient domains that got mail


@dataclass(slots=True)
class _Progress:
    after_seq: int = -1
    done: bool = False
    queued: int = 0
    skipped: int = 0
    errors: CappedErrors = field(default_factory=CappedErrors)

    def add(self, chunk: _Chunk) -> None:
        if chunk.last_seq is None:
            self.done = True
            return
        self.after_seq = chunk.last_seq
        self.queued += chunk.queued
        self.skipped += len(chunk.skipped)
        for reason in chunk.skipped:
            self.errors.add(reason)


def audience(tx: Tx, workspace_id: str, contact_list: ContactList) -> int:
    """How many contacts a send to the list reaches: those whose address is not suppressed."""
    return contact_list.contact_count - contacts.count_suppressed(tx, workspace_id, contact_list.id)


def _start(
    tx: Tx, who: Principal, req: BulkSendRequest, node: str, shard: int, now: datetime
) -> _Started:
    found = contacts.get_list(tx, who.workspace_id, req.contact_list_id)
    if found is None:
        raise NotFound("contact list not found")
    sender = domains.get_sender(tx, who.workspace_id, req.sender_address_id)
    if sender is None:
        raise NotFound("sender address not found", code="sender_not_found")
    domain = intake.verified_sender(tx, sender)
    if not isinstance(domain, Domain):
        raise NotFound(f"sender address {sender.email} {domain}", code="sender_not_found")
    if problem := stopped_problem(domain):
        raise Conflict(problem, code="marketing_stopped")
    if found.contact_count == 0:
        raise InvalidRequest("the contact list is empty", code="empty_list")
    plan = plans.plan(who.plan)
    to_send = audience(tx, who.workspace_id, found)
    used = intake.counted_volume(tx, who.workspace_id, now, shard, plan, to_send)
    if problem := intake.volume_problem(plan, used, to_send):
        raise PlanLimit(
            f"{problem}; {used} are used and this send needs {to_send}",
            limit=plan.emails_per_month,
        )
    # Reserved for the whole send at once; `_close` corrects it to what was queued.
    emails.count_sent(tx, who.workspace_id, intake.month(now), to_send, shard)
    broadcast = Broadcast(
        id=new_id(),
        workspace_id=who.workspace_id,
        contact_list_id=found.id,
        sender_id=sender.id,
        domain_id=domain.id,
        from_address=sender.email,
        name=req.subject,
        tags=list(req.tags),
        status="sending",
        queued=0,
        skipped=0,
        reserved=to_send,
        node=node,
        failure_reason=None,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )
    broadcasts.insert(tx, broadcast)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("broadcast.created", req.subject, broadcast.id, {"contact_list": found.name}),
        now,
    )
    return _Started(broadcast, sender)


def _plausible(email: str) -> bool:
    # Contacts were validated when added; this only guards against rows that were not.
    local, _, domain = email.rpartition("@")
    return bool(local) and "." in domain and " " not in email


def _queue_chunk(
    tx: Tx, started: _Started, req: BulkSendRequest, after_seq: int, now: datetime
) -> _Chunk:
    """Queue the CHUNK contacts after `after_seq`."""
    broadcast = started.broadcast
    batch = contacts.recipients_after(
        tx, broadcast.workspace_id, broadcast.contact_list_id, after_seq, CHUNK
    )
    if not batch:
        return _Chunk(None, 0, [], [])
    sender = started.sender
    sending_domain = sender.email.rsplit("@", 1)[1]
    headers = list_headers.for_broadcast(
        broadcast.id, broadcast.workspace_id, sender.id, broadcast.contact_list_id, sending_domain
    )
    personal: list[NewEmail] = []
    skipped: list[str] = []
    for contact in batch:
        if contact.suppressed is not None:
            skipped.append(f"{contact.email}: suppressed ({contact.suppressed})")
            continue
        if not _plausible(contact.email):
            skipped.append(f"{contact.email}: not a valid email address")
            continue
        values = contact_values(contact.email, contact.name, contact.metadata)
        personal.append(
            NewEmail(
                workspace_id=broadcast.workspace_id,
                domain_id=broadcast.domain_id,
                domain_name=sending_domain,
                from_email=sender.email,
                from_name=sender.name,
                to=(Mailbox(contact.email, contact.name),),
                subject=render_subject(req.subject, values),
                html=None if req.html is None else render(req.html, values, escape_html=True),
                text=None if req.text is None else render(req.text, values),
                tags=req.tags,
                headers=headers,
                source="broadcast",
                unsubscribe=True,  # one-click, mailto:, visible link (issue 30)
                broadcast_id=broadcast.id,
            )
        )
    # The volume was reserved when the send started; delivery is woken after the last chunk.
    intake.store(tx, personal, now, volume_shard=None, announce=False)
    complaint_guard.hold_if_paused(tx, broadcast, now)
    broadcasts.progress(tx, broadcast.id, len(personal), len(skipped), now)
    domains_woken = sorted({new.to[0].email.rsplit("@", 1)[1] for new in personal})
    return _Chunk(batch[-1].seq, len(personal), skipped, domains_woken)


def _close(
    tx: Tx, broadcast: Broadcast, actor: str, error: str | None, shard: int, now: datetime
) -> None:
    """End a broadcast: `sent`, or `failed` when nothing was queued or queuing stopped;
    the month's volume is corrected from what was reserved to what was queued."""
    counts = broadcasts.get(tx, broadcast.workspace_id, broadcast.id)
    assert counts is not None
    if counts.queued != broadcast.reserved:  # contacts changed meanwhile, or queuing stopped
        emails.count_sent(
            tx,
            broadcast.workspace_id,
            intake.month(broadcast.created_at),
            counts.queued - broadcast.reserved,
            shard,
        )
    if error is None and counts.queued == 0:
        error = "every contact was skipped"
    status = "failed" if error is not None else "sent"
    broadcasts.finish(tx, broadcast.id, status, error, now)
    meta: dict[str, Any] = {"queued": counts.queued, "skipped": counts.skipped}
    if error is not None:
        meta["reason"] = error
    record(
        tx,
        broadcast.workspace_id,
        actor,
        Change(f"broadcast.{status}", broadcast.name, broadcast.id, meta),
        now,
    )


def check_request(req: BulkSendRequest) -> None:
    """The rules of the body itself: html or text, a subject without the unsubscribe link,
    and tags that fit a header line (422)."""
    if not (req.html or req.text):
        raise Unprocessable(
            "at least one of html or text is required",
            errors=[{"loc": ["body", "html"], "msg": "html or text is required"}],
        )
    if problem := subject_problem(req.subject):
        raise Unprocessable(problem, errors=[{"loc": ["body", "subject"], "msg": problem}])
    for i, tag in enumerate(req.tags):
        if problem := header_text_problem(tag):
            message = f"tag {problem}"
            raise Unprocessable(message, errors=[{"loc": ["body", "tags", i], "msg": message}])


async def send_to_list(
    rt: Runtime, who: Principal, list_id: str, req: BulkSendRequest
) -> BulkSendResult:
    """Queue one personalised email per eligible contact of the list."""
    if req.contact_list_id != list_id:
        raise InvalidRequest(
            "contact_list_id must be the list named in the URL", code="list_mismatch"
        )
    check_request(req)
    started = await rt.db.write(_start, who, req, rt.node, rt.usage_shard, rt.clock.now())
    progress = _Progress()
    error: str | None = None
    woken: set[str] = set()
    with trio.CancelScope(shield=True):
        try:
            while not progress.done:
                chunk = await rt.db.transaction(
                    _queue_chunk, started, req, progress.after_seq, rt.clock.now()
                )
                progress.add(chunk)
                woken.update(chunk.domains)
        except Exception as exc:
            error = f"queuing stopped: {exc}"
            raise
        finally:
            await rt.db.write(
                _close, started.broadcast, who.user_email, error, rt.usage_shard, rt.clock.now()
            )
            # Once, at the end: delivering the first chunks while the rest are queued would
            # compete for the same CPU and writer, and make the whole send slower to accept
            # without delivering its last message any sooner.
            rt.wakeups.announce(f"mail:{domain}" for domain in woken)
    return BulkSendResult(
        started.broadcast.id, progress.queued, progress.skipped, progress.errors.result()
    )


def _fail_interrupted(tx: Tx, actor: str, shard: int, now: datetime) -> int:
    left = broadcasts.interrupted(tx, now - STALE_AFTER)
    for broadcast in left:
        error = "interrupted: the service stopped while queuing"
        _close(tx, broadcast, actor, error, shard, now)
    return len(left)


async def fail_interrupted(rt: Runtime) -> int:
    """Fail the broadcasts a node left `sending` when it stopped or died (at start-up, and
    when a dead node is reaped), and any that made no progress for STALE_AFTER; how many."""
    return await rt.db.write(_fail_interrupted, rt.system_from, rt.usage_shard, rt.clock.now())


async def broadcasts_page(rt: Runtime, who: Principal, page: int, limit: int) -> list[Broadcast]:
    """The workspace's broadcasts, newest first; `page` is zero-based."""
    return await rt.db.read(broadcasts.page, who.workspace_id, page * limit, limit)


async def broadcast(rt: Runtime, who: Principal, broadcast_id: str) -> Broadcast:
    found = await rt.db.read(broadcasts.get, who.workspace_id, broadcast_id)
    if found is None:
        raise NotFound("broadcast not found")
    return found
