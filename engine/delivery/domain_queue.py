"""`DomainQueue`: the actor that delivers every recipient of one domain.

It claims due recipients from the database with a lease, builds and signs their messages in
one thread hop, finds the domain's MX hosts, and sends over up to `CONNECTIONS` parallel SMTP
connections, each reused for message after message and opportunistically upgraded with
STARTTLS. `CONNECTIONS` holds across every node: a round first takes connection slots of
the destination from the database (storage/destination_slots.py) and opens only as many
connections as it holds; a node finding them all taken waits for a release. A recipient suppressed after its email was accepted is not sent to. The outcome of a whole round is written in one
unit of work: 2xx -> `delivered`; 4xx or a network failure -> `deferred` on the retry
schedule (`failed` after 72 h); 5xx -> `bounced`, and the address is suppressed.

When nothing is due it sleeps until the next retry or until woken; after `IDLE_EXIT` with no
work at all it returns, and the router starts it again when work arrives.
"""

from __future__ import annotations

import logging
import ssl
from collections import defaultdict, deque
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import trio

from engine import dns as lookups
from engine import faults
from engine.delivery import mx, retry
from engine.delivery.latency import LatencyHistogram
from engine.delivery.messages import LinkSettings, WireMessage, build_all
from engine.nodes import LEASE
from engine.runtime import Runtime
from engine.sandbox import capture as sandbox_capture
from engine.smtp.errors import SmtpError
from engine.smtp.replies import SmtpReply
from engine.smtp.session import SmtpSession, connect
from storage import delivery, destination_slots, emails
from storage.codec import new_id
from storage.domains import Domain
from storage.emails import Email, Event, Recipient, RecipientUpdate, Unreadable
from storage.suppressions import Suppression
from storage.tx import Tx

BATCH = 200
CONNECTIONS = 4  # parallel SMTP connections to one domain, across every node
IDLE_EXIT = timedelta(minutes=5)
SLOTS_POLL = timedelta(seconds=1)  # all slots taken elsewhere: look again at least this often

log = logging.getLogger("postroom.delivery")


def opportunistic_tls() -> ssl.SSLContext:
    """STARTTLS as MTAs use it between each other: encrypt when offered, verify nothing."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@dataclass(frozen=True, slots=True)
class DomainQueueStatistics:
    domain: str
    rounds: int
    delivered: int
    deferred: int
    bounced: int
    failed: int
    in_flight: int = 0  # recipients claimed by the round under way


class _Round:
    """The outcomes gathered in one delivery round, written together at its end."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.updates: list[RecipientUpdate] = []
        self.events: list[Event] = []
        self.bounces: list[tuple[str, Suppression]] = []
        self.counts: dict[str, int] = defaultdict(int)

    def _event(self, email: Email, kind: str, recipient: str, **meta: Any) -> None:
        metadata = {"subject": email.subject, "tags": email.tags, **meta}
        # A microsecond apart, so a timeline reads in the order things happened (sent, then
        # delivered) even though the round records them all at once.
        at = self.now + timedelta(microseconds=len(self.events))
        self.events.append(
            Event(new_id(), email.id, email.workspace_id, kind, recipient, metadata, at)
        )

    def delivered(self, email: Email, recipient: Recipient, reply: SmtpReply) -> None:
        domain = recipient.domain
        self._event(email, "sent", recipient.address, domain=domain)
        self._event(email, "delivered", recipient.address, domain=domain, smtp_response=str(reply))
        self.updates.append(
            RecipientUpdate(email.id, recipient.address, "delivered", None, str(reply))
        )
        self.counts["delivered"] += 1

    def bounced(self, email: Email, recipient: Recipient, response: str) -> None:
        self._event(
            email, "bounced", recipient.address, dsn=None, response=response, bounce_type="hard"
        )
        self.updates.append(RecipientUpdate(email.id, recipient.address, "bounced", None, response))
        self.bounces.append(
            (email.workspace_id, Suppression(recipient.address, "hard_bounce", self.now, email.id))
        )
        self.counts["bounced"] += 1

    def temporary(self, email: Email, recipient: Recipient, response: str) -> None:
        when = retry.next_attempt(recipient.attempts + 1, recipient.queued_at, self.now)
        if when is None:
            self._event(
                email, "failed", recipient.address, error=f"gave up after 72 hours: {response}"
            )
            self.updates.append(
                RecipientUpdate(email.id, recipient.address, "failed", None, response)
            )
            self.counts["failed"] += 1
        else:
            self._event(
                email,
                "deferred",
                recipient.address,
                response=response,
                next_attempt_at=when.isoformat(),
            )
            self.updates.append(
                RecipientUpdate(email.id, recipient.address, "deferred", when, response)
            )
            self.counts["deferred"] += 1

    def unreadable(self, recipient: Recipient, unreadable: Unreadable) -> None:
        """A recipient of an email whose stored row cannot be read: failed, nothing sent."""
        at = self.now + timedelta(microseconds=len(self.events))
        meta = {"error": unreadable.error}
        address = recipient.address
        self.events.append(
            Event(
                new_id(), recipient.email_id, unreadable.workspace_id, "failed", address, meta, at
            )
        )
        self.updates.append(
            RecipientUpdate(recipient.email_id, address, "failed", None, unreadable.error)
        )
        self.counts["failed"] += 1

    def failed(self, email: Email, recipient: Recipient, error: str) -> None:
        self._event(email, "failed", recipient.address, error=error)
        self.updates.append(RecipientUpdate(email.id, recipient.address, "failed", None, error))
        self.counts["failed"] += 1


@dataclass(frozen=True, slots=True)
class _Transfer:
    """One email to its recipients at this domain: one SMTP transaction."""

    email: Email
    recipients: list[Recipient]
    message: WireMessage


@dataclass(frozen=True, slots=True)
class _Batch:
    """A round's emails, each with its sending domain and its recipients suppressed since;
    and the emails whose stored row cannot be read."""

    emails: list[tuple[Email, Domain | None, dict[str, str]]]
    unreadable: dict[str, Unreadable]


@dataclass(frozen=True, slots=True)
class _Claim:
    """What a round starts with: its recipients and the connection slots it holds; when the
    next unleased recipient falls due; and whether every slot was taken elsewhere."""

    recipients: list[Recipient]
    slots: list[int]
    next_due: datetime | None
    slots_busy: bool


def _claim(tx: Tx, domain: str, now: datetime, node: str) -> _Claim:
    until = now + LEASE
    slots = destination_slots.acquire(tx, domain, CONNECTIONS, CONNECTIONS, node, now, until)
    if not slots:
        return _Claim([], [], None, slots_busy=True)
    claimed, next_due = emails.claim(tx, domain, now, until, node, BATCH)
    # One connection per email at most: give back the slots the round cannot use (no other
    # node saw them taken, so nobody needs waking).
    needed = len({r.email_id for r in claimed})
    destination_slots.release(tx, domain, slots[needed:], node, announce=False)
    return _Claim(claimed, slots[:needed], next_due, slots_busy=False)


def _record(tx: Tx, outcome: _Round, domain: str, slots: list[int], node: str) -> None:
    delivery.record_outcomes(tx, outcome.updates, outcome.events, outcome.bounces, outcome.now)
    destination_slots.release(tx, domain, slots, node)


def _record_faults(tx: Tx, claim: _Claim, error: str, domain: str, node: str, now: datetime) -> int:
    destination_slots.release(tx, domain, claim.slots, node)
    return emails.record_faults(tx, claim.recipients, error, now, faults.policy(now))


def _load_batch(tx: Tx, by_email: dict[str, list[Recipient]]) -> _Batch:
    pairs, unreadable = delivery.emails_with_domains(tx, list(by_email))
    return _Batch(
        [
            (
                email,
                domain,
                delivery.suppressed_since_accepted(
                    tx, email, [r.address for r in by_email[email.id]]
                ),
            )
            for email, domain in pairs
        ],
        unreadable,
    )


class DomainQueue:
    def __init__(
        self,
        rt: Runtime,
        domain: str,
        tls: ssl.SSLContext,
        rounds: trio.CapacityLimiter,
        latency: LatencyHistogram | None = None,
    ) -> None:
        self._rt = rt
        self.domain = domain
        self._tls = tls
        self._rounds_in_flight = rounds
        # Accept -> 250 per delivered recipient, shared by the router's queues (for /metrics).
        self._latency = latency or LatencyHistogram()
        self._in_flight = 0
        self._woken = trio.Event()
        self._rounds = 0
        self._counts: dict[str, int] = defaultdict(int)

    def wake(self) -> None:
        self._woken.set()

    async def run(self) -> None:
        """Deliver until there has been no work for IDLE_EXIT."""
        clock = self._rt.clock
        while True:
            self._woken = trio.Event()  # reset before claiming: a wake-up now is not lost
            # A round holds one of the router's slots from its claim to its outcome: with a
            # long backlog over many domains, only so many batches are built and held at once.
            async with self._rounds_in_flight:
                now = clock.now()
                claim = await self._rt.db.write(_claim, self.domain, now, self._rt.node)
                if claim.recipients:
                    self._in_flight = len(claim.recipients)
                    try:
                        await self._deliver(claim)
                    except Exception as exc:
                        if not faults.blames_item(exc):
                            raise
                        await self._fault(claim, exc)
                    finally:
                        self._in_flight = 0
            if claim.recipients:
                continue
            if claim.slots_busy:
                wait_until = now + SLOTS_POLL
            else:
                wait_until = claim.next_due if claim.next_due is not None else now + IDLE_EXIT
            with trio.move_on_at(clock.deadline_for(wait_until)):
                await self._woken.wait()
            if claim.next_due is None and not claim.slots_busy and not self._woken.is_set():
                return

    async def _fault(self, claim: _Claim, exc: Exception) -> None:
        """The round raised: count a fault on each of its recipients (the items it held) and
        try them again later; three faults quarantine a recipient (engine/faults.py)."""
        rt = self._rt
        what = f"a round of {len(claim.recipients)} recipients at {self.domain}"
        error = rt.faults.item_fault("delivery", what, exc)
        quarantined = await rt.db.write(
            _record_faults, claim, error, self.domain, rt.node, rt.clock.now()
        )
        rt.faults.quarantined("delivery", quarantined)

    async def _deliver(self, claim: _Claim) -> None:
        self._rounds += 1
        claimed = claim.recipients
        by_email: dict[str, list[Recipient]] = defaultdict(list)
        for recipient in claimed:
            by_email[recipient.email_id].append(recipient)
        batch = await self._rt.db.read(_load_batch, dict(by_email))
        links = LinkSettings(self._rt.public_url, self._rt.secret_key)
        built = await trio.to_thread.run_sync(
            build_all, [(e, d) for e, d, _ in batch.emails], links
        )
        outcome = _Round(self._rt.clock.now())
        for email_id, unreadable in batch.unreadable.items():
            for recipient in by_email[email_id]:
                outcome.unreadable(recipient, unreadable)
        work: list[_Transfer] = []
        for email, _, late in batch.emails:
            message = built[email.id]
            recipients = []
            for recipient in by_email[email.id]:
                if recipient.address in late:
                    reason = late[recipient.address]
                    outcome.failed(
                        email, recipient, f"suppressed ({reason}) after the email was accepted"
                    )
                elif isinstance(message, str):
                    outcome.failed(email, recipient, message)
                else:
                    recipients.append(recipient)
            if recipients and isinstance(message, WireMessage):
                work.append(_Transfer(email, recipients, message))
        if work:
            await self._send(work, outcome, connections=len(claim.slots))
        await self._rt.db.write(_record, outcome, self.domain, claim.slots, self._rt.node)
        for kind, count in outcome.counts.items():
            self._counts[kind] += count

    async def _send(self, work: list[_Transfer], outcome: _Round, connections: int) -> None:
        """Hand the transfers to `connections` parallel sessions with the domain's MX."""
        rt = self._rt
        # Sandboxed workspaces' transfers never reach the network (engine/sandbox/capture.py).
        work = await sandbox_capture.divert(rt, work, outcome)
        if not work:
            return
        try:
            targets = await mx.targets(
                rt.resolver, self.domain, allow_private=rt.allow_private_targets
            )
        except mx.NoMailService as exc:
            for transfer in work:
                for recipient in transfer.recipients:
                    outcome.bounced(transfer.email, recipient, str(exc))
            return
        # Refused by our own rule: not the recipient's fault (no bounce, no suppression); DNS
        # may point elsewhere later, so it waits on the retry schedule.
        except (lookups.TemporaryDnsError, mx.PrivateTargets) as exc:
            for transfer in work:
                for recipient in transfer.recipients:
                    outcome.temporary(transfer.email, recipient, str(exc))
            return
        queue = deque(work)
        problems: list[str] = []
        async with trio.open_nursery() as nursery:
            for _ in range(min(connections, len(work))):
                nursery.start_soon(self._connection, targets, queue, outcome, problems)
        # Whatever no connection could take waits for the next round.
        reason = "; ".join(dict.fromkeys(problems)) or "no connection to the MX host"
        for transfer in queue:
            for recipient in transfer.recipients:
                outcome.temporary(transfer.email, recipient, reason)

    async def _connection(
        self,
        targets: list[mx.MxTarget],
        queue: deque[_Transfer],
        outcome: _Round,
        problems: list[str],
    ) -> None:
        """One SMTP connection, reused for transfer after transfer until the queue is empty."""
        session = await self._open(targets)
        if isinstance(session, str):
            problems.append(session)
            return
        try:
            while queue:
                transfer = queue.popleft()
                addresses = [r.address for r in transfer.recipients]
                try:
                    result = await session.send(
                        transfer.message.envelope_from, addresses, transfer.message.data
                    )
                except SmtpError as exc:
                    # The connection broke: this transfer waits for the next round; the
                    # other connections go on with the rest.
                    for recipient in transfer.recipients:
                        outcome.temporary(transfer.email, recipient, str(exc))
                    return
                for recipient in transfer.recipients:
                    reply = result.outcome_for(recipient.address)
                    if reply.is_positive:
                        outcome.delivered(transfer.email, recipient, reply)
                        waited = self._rt.clock.now() - recipient.queued_at
                        self._latency.observe(waited.total_seconds())
                    elif reply.is_permanent:
                        outcome.bounced(transfer.email, recipient, str(reply))
                    else:
                        outcome.temporary(transfer.email, recipient, str(reply))
        finally:
            with trio.move_on_after(5):
                await session.aclose()

    async def _open(self, targets: list[mx.MxTarget]) -> SmtpSession | str:
        """A session with the first MX host that answers, or why none did."""
        problems = []
        for target in targets:
            for address in target.addresses:
                try:
                    return await connect(
                        address, self._rt.delivery_port, helo_name=self._rt.smtp_host, tls=self._tls
                    )
                except SmtpError as exc:
                    problems.append(f"{target.host} [{address}]: {exc}")
        return "; ".join(problems) or "no MX host to try"

    def statistics(self) -> DomainQueueStatistics:
        c = self._counts
        return DomainQueueStatistics(
            self.domain,
            self._rounds,
            c["delivered"],
            c["deferred"],
            c["bounced"],
            c["failed"],
            self._in_flight,
        )
