"""The forwarder: sends stored inbound mail on to each forward's emails and URLs.

Work lives in the database (`forward_jobs`, written with the message before the inbound
server answered 250) and is claimed with leases, so a restart resumes it and two nodes never
run one job. A job reads its message's content only once the process's memory budget has
room for it (engine/platform/message_memory.py). An email destination becomes an email of the
forward's workspace through `raw_mail.store_raw` (source "forward"), in the same unit of work
as the job's outcome and its log entry, and only while this node still holds the job's lease
(checked in that unit: a node declared dead while it worked a job writes nothing of it), so a
copy is queued exactly once; delivery then signs it with the forward domain's key and sends it
from that email's bounce address. A destination address on the workspace's suppression list
is not sent to (unless only unsubscribed: a forward offers no unsubscribe,
engine/suppressions/scopes.py). A URL destination gets the message as JSON
(engine/mail/forwarding.py) in a POST, retried on the webhook schedule (1 m, 5 m, 30 m, 2 h,
6 h, 24 h, 48 h; the 8th failure is final); for a workspace in the sandbox the POST is
captured instead (engine/sandbox/posts.py, given by postroom/service.py as a `PostCapture`),
never sent. Every forwarded copy writes a forward log entry and counts on its rule.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from pathlib import Path

import trio

from engine.mail import forwarding
from engine.platform import faults, outbound_http
from engine.platform.errors import EngineError
from engine.platform.http1_client import Client
from engine.platform.leased_worker import LeasedWorker
from engine.platform.nodes import LEASE
from engine.platform.runtime import Runtime
from engine.sending import raw_mail
from engine.sending.raw_mail import RawMail
from engine.suppressions import scopes
from engine.webhooks.dispatcher import PostCapture
from storage import forwards, inbound, sandbox, suppressions
from storage.codec import new_id
from storage.forwards import LogEntry
from storage.inbound import InboundMessage, Job, Outcome
from storage.leases import Claimed, Fault
from storage.tx import Tx

BATCH = 200
MAX_IN_FLIGHT = 100  # jobs worked at once
TIMEOUT = 10.0  # seconds a URL gets to answer a POST
POLL = timedelta(seconds=5)  # a safety net: stored inbound mail wakes every node

log = logging.getLogger("postroom.forwarder")


@dataclass(frozen=True, slots=True)
class ForwarderStatistics:
    in_flight: int
    emailed: int
    posted: int
    failed_attempts: int
    failed: int


Work = tuple[Job, InboundMessage]


def _claim(tx: Tx, now: datetime, node: str, limit: int) -> Claimed[Work]:
    policy = faults.policy(now)
    claimed = inbound.claim_due(tx, now, now + LEASE, node, limit, policy)
    jobs = claimed.items
    # Without their content: a claim of 200 jobs must not read 200 large messages at once.
    stored, missing = inbound.messages(tx, [job.message_id for job in jobs], content=False)
    unreadable = [Fault(j.id, missing[j.message_id]) for j in jobs if j.message_id in missing]
    quarantined = inbound.JOBS.record_faults(tx, unreadable, now, policy)
    return Claimed(
        [(job, stored[job.message_id]) for job in jobs if job.message_id in stored],
        claimed.next_due,
        claimed.faults + unreadable,
        claimed.quarantined + quarantined,
    )


def _log_entry(job: Job, message: InboundMessage, now: datetime) -> LogEntry:
    about = forwarding.summary(message.data, message.envelope_from)
    return LogEntry(
        id=new_id(),
        forward_id=job.forward_id,
        from_address=about.from_address,
        original_to=job.original_to,
        forwarded_to=job.target,
        subject=about.subject,
        message_id=about.message_id,
        size_bytes=len(message.data),
        created_at=now,
    )


def _email_one(
    tx: Tx,
    job: Job,
    copy: bytes,
    entry: LogEntry,
    envelope_from: str | None,
    now: datetime,
    shard: int,
) -> bool:
    """Queue one emailed `copy` (logged as `entry`); whether it was, else the job failed."""
    suppressed = suppressions.get(tx, job.workspace_id, job.target)
    if suppressed is not None and scopes.blocks(suppressed.reason, subscribed=False):
        reason = f"{job.target} is suppressed ({suppressed.reason})"
        inbound.record_outcomes(tx, [Outcome(job.id, "failed", None, reason)], now)
        return False
    forward = forwards.get(tx, job.workspace_id, job.forward_id)
    domain_id = None if forward is None else forward.domain_id
    mail = RawMail(
        workspace_id=job.workspace_id,
        domain_id=domain_id or "",
        from_email=envelope_from or job.original_to,
        recipients=[job.target],
        data=copy,
        source="forward",
    )
    try:
        raw_mail.store_raw(tx, mail, now, shard)
    except (EngineError, ValueError) as exc:
        inbound.record_outcomes(tx, [Outcome(job.id, "failed", None, str(exc))], now)
        return False
    forwards.record_delivery(tx, entry, job.workspace_id)
    inbound.record_outcomes(tx, [Outcome(job.id, "done", None, None)], now)
    return True


def _emailed(
    tx: Tx, job: Job, message: InboundMessage, now: datetime, shard: int, node: str
) -> bool | None:
    """Queue the job's copy, with its outcome; whether it was queued (else the job failed).
    None when `node` no longer holds the job: it was declared dead meanwhile and another
    node may have forwarded it, so nothing is written (no second copy)."""
    if not inbound.JOBS.held(tx, job.id, node):
        return None
    data = inbound.content(tx, message.id)
    if data is None:  # gone since the claim (retention): nothing to send
        reason = "the inbound message is gone"
        inbound.record_outcomes(tx, [Outcome(job.id, "failed", None, reason)], now)
        return False
    entry = _log_entry(job, replace(message, data=data), now)
    copy = forwarding.forwarded_copy(data, job.original_to, job.target)
    # The received message is not held while its copy is stored (issue 28: on PostgreSQL
    # the driver holds one more copy while it sends it).
    del data
    queued = _email_one(tx, job, copy, entry, message.envelope_from, now, shard)
    inbound.finish(tx, [job.message_id])
    return queued


def _posted(
    tx: Tx, job: Job, message: InboundMessage, outcome: Outcome, now: datetime, node: str
) -> None:
    """Record a POST's outcome, unless `node` no longer holds the job (another node's now:
    its outcome is that node's to write)."""
    if not inbound.JOBS.held(tx, job.id, node):
        return
    if outcome.status == "done":
        forwards.record_delivery(tx, _log_entry(job, message, now), job.workspace_id)
    inbound.record_outcomes(tx, [outcome], now)
    inbound.finish(tx, [job.message_id])


def _request(job: Job, message: InboundMessage) -> tuple[bytes, dict[str, str]]:
    """The body and header fields of the POST of `message` to a URL destination."""
    document = {
        "forward_id": job.forward_id,
        "recipient": job.original_to,
        "envelope_from": message.envelope_from,
        "received_at": message.received_at.isoformat().replace("+00:00", "Z"),
        **forwarding.json_document(message.data),
    }
    body = json.dumps(document).encode()
    return body, {"Content-Type": "application/json", "User-Agent": "Postroom-Forwards/1"}


class Forwarder:
    name = "forwarder"
    table = inbound.JOBS

    def __init__(self, rt: Runtime, extra_ca_file: Path | None, sandbox: PostCapture) -> None:
        self._rt = rt
        self._sandbox = sandbox
        self._tls = outbound_http.tls_context(extra_ca_file)
        self._client: Client | None = None
        self._worker = LeasedWorker(
            rt, self, in_flight=MAX_IN_FLIGHT, batch=BATCH, poll=POLL, wakeups=rt.wakeups.forwards
        )
        self._counts: dict[str, int] = defaultdict(int)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self._client = outbound_http.client(self._rt, self._tls)
        try:
            await self._worker.run(task_status)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._client.aclose()

    async def drain(self) -> None:
        """Stop claiming; return once the forwards under way are sent and recorded."""
        await self._worker.drain()

    def key(self, item: Work) -> str:
        return item[0].id

    async def claim(self, now: datetime, limit: int) -> Claimed[Work]:
        return await self._rt.db.write(_claim, now, self._rt.node, limit)

    async def work(self, item: Work) -> None:
        job, message = item
        # The message is read whole and copied once: wait for room in the process's budget.
        async with self._rt.message_memory.holding(self._rt.message_memory.cost(message.size)):
            await self._work(job, message)

    async def _work(self, job: Job, message: InboundMessage) -> None:
        if job.kind == "email":
            rt = self._rt
            now = rt.clock.now()
            queued = await rt.db.write(_emailed, job, message, now, rt.usage_shard, rt.node)
            if queued is None:
                log.warning("forward job %s was freed while this node worked it: dropped", job.id)
            elif queued:
                self._counts["emailed"] += 1
            else:
                self._counts["failed"] += 1
            return
        rt = self._rt
        data = await rt.db.read(inbound.content, message.id)
        if data is None:
            gone = Outcome(job.id, "failed", None, "the inbound message is gone")
            await rt.db.write(_posted, job, message, gone, rt.clock.now(), rt.node)
            return
        message = replace(message, data=data)
        body, headers = _request(job, message)
        if await rt.db.read(sandbox.is_sandboxed, job.workspace_id):
            done = Outcome(job.id, "done", None, None)

            def posted(tx: Tx, now: datetime) -> None:
                _posted(tx, job, message, done, now, rt.node)

            self._counts["posted"] += 1
            request = (job.target, headers, body)
            await self._sandbox.capture(job.workspace_id, "forward", job.id, request, posted)
            return
        outcome = await self._attempt(job, body, headers)
        await rt.db.write(_posted, job, message, outcome, rt.clock.now(), rt.node)

    async def _attempt(self, job: Job, body: bytes, headers: dict[str, str]) -> Outcome:
        assert self._client is not None
        answer = await outbound_http.post(self._client, job.target, body, headers, TIMEOUT)
        if answer.ok:
            self._counts["posted"] += 1
            return Outcome(job.id, "done", None, None)
        error = answer.text if answer.status is None else f"HTTP {answer.status}"
        self._counts["failed_attempts"] += 1
        delay = outbound_http.next_retry(job.attempt + 1)
        if delay is None:
            self._counts["failed"] += 1
            log.warning("forward %s gave up on %s: %s", job.forward_id, job.target, error)
            return Outcome(job.id, "failed", None, error)
        return Outcome(job.id, "retrying", self._rt.clock.now() + delay, error)

    def statistics(self) -> ForwarderStatistics:
        return ForwarderStatistics(
            in_flight=self._worker.in_flight,
            emailed=self._counts["emailed"],
            posted=self._counts["posted"],
            failed_attempts=self._counts["failed_attempts"],
            failed=self._counts["failed"],
        )
