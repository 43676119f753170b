"""The forwarder: sends stored inbound mail on to each forward's emails and URLs.

Work lives in the database (`forward_jobs`, written with the message before the inbound
server answered 250) and is claimed with leases, so a restart resumes it and two nodes never
run one job. An email destination becomes an email of the forward's workspace through
`raw_mail.store_raw` (source "forward"), in the same unit of work as the job's outcome and
its log entry, so a copy is queued exactly once; delivery then signs it with the forward
domain's key and sends it from that email's bounce address. A destination address on the
workspace's suppression list is not sent to. A URL destination gets the message as JSON
(engine/mail/forwarding.py) in a POST, retried on the webhook schedule (1 m, 5 m, 30 m,
2 h, 6 h, 24 h, 48 h; the 8th failure is final). Every forwarded copy writes a forward log
entry and counts on its rule.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx
import trio

from engine import outbound_http, raw_mail
from engine.errors import EngineError
from engine.mail import forwarding
from engine.raw_mail import RawMail
from engine.runtime import Runtime
from engine.webhook_dispatcher import TIMEOUT, next_retry
from storage import forwards, inbound, suppressions
from storage.codec import new_id
from storage.forwards import LogEntry
from storage.inbound import InboundMessage, Job, Outcome
from storage.tx import Tx

BATCH = 200
MAX_IN_FLIGHT = 100  # concurrent URL POSTs
LEASE = timedelta(minutes=5)
POLL = timedelta(seconds=1)  # other nodes' inbound mail is noticed within this

log = logging.getLogger("postroom.forwarder")


@dataclass(frozen=True, slots=True)
class ForwarderStatistics:
    in_flight: int
    emailed: int
    posted: int
    failed_attempts: int
    failed: int


def _claim(
    tx: Tx, now: datetime, node: str, limit: int
) -> tuple[list[tuple[Job, InboundMessage]], datetime | None]:
    jobs, next_due = inbound.claim_due(tx, now, now + LEASE, node, limit)
    stored = inbound.messages(tx, [job.message_id for job in jobs])
    return [(job, stored[job.message_id]) for job in jobs if job.message_id in stored], next_due


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


def _email_one(tx: Tx, job: Job, message: InboundMessage, now: datetime) -> RawMail | None:
    """Queue one emailed copy; the mail stored, or None with the job failed."""
    suppressed = suppressions.get(tx, job.workspace_id, job.target)
    if suppressed is not None:
        reason = f"{job.target} is suppressed ({suppressed.reason})"
        inbound.record_outcomes(tx, [Outcome(job.id, "failed", None, reason)], now)
        return None
    forward = forwards.get(tx, job.workspace_id, job.forward_id)
    domain_id = None if forward is None else forward.domain_id
    mail = RawMail(
        workspace_id=job.workspace_id,
        domain_id=domain_id or "",
        from_email=message.envelope_from or job.original_to,
        recipients=[job.target],
        data=forwarding.forwarded_copy(message.data, job.original_to, job.target),
        source="forward",
    )
    try:
        raw_mail.store_raw(tx, mail, now)
    except (EngineError, ValueError) as exc:
        inbound.record_outcomes(tx, [Outcome(job.id, "failed", None, str(exc))], now)
        return None
    forwards.record_delivery(tx, _log_entry(job, message, now), job.workspace_id)
    inbound.record_outcomes(tx, [Outcome(job.id, "done", None, None)], now)
    return mail


def _email_all(
    tx: Tx, work: list[tuple[Job, InboundMessage]], now: datetime
) -> list[RawMail | None]:
    queued = [_email_one(tx, job, message, now) for job, message in work]
    inbound.finish(tx, [job.message_id for job, _ in work])
    return queued


def _posted(tx: Tx, job: Job, message: InboundMessage, outcome: Outcome, now: datetime) -> None:
    if outcome.status == "done":
        forwards.record_delivery(tx, _log_entry(job, message, now), job.workspace_id)
    inbound.record_outcomes(tx, [outcome], now)
    inbound.finish(tx, [job.message_id])


class Forwarder:
    name = "forwarder"

    def __init__(self, rt: Runtime, extra_ca_file: Path | None) -> None:
        self._rt = rt
        self._tls = outbound_http.tls_context(extra_ca_file)
        self._client: httpx.AsyncClient | None = None
        self._in_flight = trio.CapacityLimiter(MAX_IN_FLIGHT)
        self._posting: set[str] = set()
        self._counts: dict[str, int] = defaultdict(int)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rt = self._rt
        await rt.db.write(inbound.release_leases, rt.node)
        self._client = outbound_http.client(rt, self._tls, TIMEOUT)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    now = rt.clock.now()
                    room = min(BATCH, int(self._in_flight.available_tokens))
                    claimed, next_due = await rt.db.write(_claim, now, rt.node, room or 1)
                    await self._start(nursery, claimed)
                    if claimed:
                        continue
                    wake = now + POLL if next_due is None else min(next_due, now + POLL)
                    await self._wait(wake)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                await self._client.aclose()

    async def _wait(self, until: datetime) -> None:
        """Sleep until `until` or until inbound mail is stored, whichever is first."""
        with trio.move_on_at(self._rt.clock.deadline_for(until)):
            await self._rt.forwarding.receive.receive()
        while True:  # one pass over the database serves every wake-up already sent
            try:
                self._rt.forwarding.receive.receive_nowait()
            except trio.WouldBlock:
                return

    async def _start(
        self, nursery: trio.Nursery, claimed: list[tuple[Job, InboundMessage]]
    ) -> None:
        emails = [(job, message) for job, message in claimed if job.kind == "email"]
        if emails:
            queued = await self._rt.db.write(_email_all, emails, self._rt.clock.now())
            mails = [mail for mail in queued if mail is not None]
            raw_mail.wake(self._rt, mails)
            self._counts["emailed"] += len(mails)
            self._counts["failed"] += len(queued) - len(mails)
        for job, message in claimed:
            # A POST outliving its lease is claimed again; the running one records it.
            if job.kind == "url" and job.id not in self._posting:
                self._posting.add(job.id)
                await self._in_flight.acquire_on_behalf_of(job.id)
                nursery.start_soon(self._post, job, message)

    async def _post(self, job: Job, message: InboundMessage) -> None:
        try:
            outcome = await self._attempt(job, message)
            await self._rt.db.write(_posted, job, message, outcome, self._rt.clock.now())
        finally:
            self._in_flight.release_on_behalf_of(job.id)
            self._posting.discard(job.id)

    async def _attempt(self, job: Job, message: InboundMessage) -> Outcome:
        document = {
            "forward_id": job.forward_id,
            "recipient": job.original_to,
            "envelope_from": message.envelope_from,
            "received_at": message.received_at.isoformat().replace("+00:00", "Z"),
            **forwarding.json_document(message.data),
        }
        body = json.dumps(document).encode()
        headers = {"Content-Type": "application/json", "User-Agent": "Postroom-Forwards/1"}
        assert self._client is not None
        try:
            with trio.fail_after(TIMEOUT):
                response = await self._client.post(job.target, content=body, headers=headers)
            error = None if 200 <= response.status_code < 300 else f"HTTP {response.status_code}"
        except (trio.TooSlowError, httpx.TimeoutException):
            error = f"no answer within {TIMEOUT:.0f} s"
        except httpx.HTTPError as exc:
            error = f"{type(exc).__name__}: {exc}"[:500]
        if error is None:
            self._counts["posted"] += 1
            return Outcome(job.id, "done", None, None)
        self._counts["failed_attempts"] += 1
        delay = next_retry(job.attempt + 1)
        if delay is None:
            self._counts["failed"] += 1
            log.warning("forward %s gave up on %s: %s", job.forward_id, job.target, error)
            return Outcome(job.id, "failed", None, error)
        return Outcome(job.id, "retrying", self._rt.clock.now() + delay, error)

    def statistics(self) -> ForwarderStatistics:
        return ForwarderStatistics(
            in_flight=MAX_IN_FLIGHT - int(self._in_flight.available_tokens),
            emailed=self._counts["emailed"],
            posted=self._counts["posted"],
            failed_attempts=self._counts["failed_attempts"],
            failed=self._counts["failed"],
        )
