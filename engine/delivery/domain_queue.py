"""`DomainQueue`: the delivery of every recipient of one domain, in rounds.

A queue is three parts, each owning its own state (docs/architecture.md):

- the scheduled side (`_Scheduled`, one task) claims up to `BATCH` due recipients with a
  lease, as the destination's policies' limits and rate budgets allow
  (engine/delivery/throttle.py; the MX hosts are looked up only for mail the router's
  routes do not all send elsewhere: sandboxed mail asks no DNS), loads their emails
  (storage/delivery.py: a fixed number of queries per round) and builds and DKIM-signs
  their messages in a worker thread;
- the ready side (`_Ready`, one task) holds the destination's connection slots, held in the
  database across every node (storage/destination_slots.py), and hands each round's
  transfers to the egress the router's routes choose (engine/delivery/egress.py): the
  sandbox's for sandboxed workspaces, else the queue's SMTP egress
  (engine/delivery/smtp_egress.py), which holds the connections;
- the writer (`_Writer`) records each round's outcomes in one unit of work per write: every
  attempt's end is a typed outcome that engine/delivery/classify.py alone turns into a
  verdict, and engine/delivery/outcomes.py into statuses, events, suppressions and
  destination incidents (opened, widened or resolved per sending domain,
  engine/delivery/incidents.py).

Rounds are pipelined: while one round is on the wire, the next one is claimed, loaded, built
and signed (RSA runs without the GIL, so the signing really overlaps the sending). At most
one round waits ahead of the one sending, and each holds one of the router's
`ROUNDS_IN_FLIGHT` from its claim to its outcome (`_Rounds`).

The ready side keeps the slots, and the SMTP egress its open connections, from one round to
the next while another round is ready, and gives them back with the outcomes of the last
one; a node finding every slot taken elsewhere claims nothing and waits for a release.

A round carries at most one submitted message larger than `LARGE`, read and built only once
the process's memory budget has room for it (engine/platform/message_memory.py); the recipients of
other large ones go back for the next rounds (issue 28: large forwarded mail must not be
held many times over at once).

When nothing is due it sleeps until the next retry or until woken; after `IDLE_EXIT` with no
work at all it returns, and the router starts it again when work arrives.

A node that cannot record what it sends must not send it: once the database fails one of the
queue's writes (an outage, storage/errors.py) or is known gone (storage/reachability.py), no
connection starts another transaction; those under way finish, and the outcomes not written
go to the router (`Kept`), which writes them before this node delivers anything else. The
queue then drains as for a stop and `run` raises the outage.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Any

import trio

from engine.delivery import incidents, outcomes, policies, throttle
from engine.delivery.classify import (
    Decision,
    Outcome,
    Replied,
    SuppressedSince,
    Unbuildable,
    Unreachable,
    Verdict,
    classify,
)
from engine.delivery.egress import Lanes, Routes, Source, Transfer
from engine.delivery.full_mailboxes import FullMailboxes
from engine.delivery.latency import LatencyHistogram
from engine.delivery.messages import LinkSettings, ToBuild, build_all
from engine.delivery.smtp_egress import SourcedEgress
from engine.platform import faults, tls_counts
from engine.platform.nodes import LEASE
from engine.platform.runtime import Runtime
from engine.sending import statuses
from engine.sending import unsubscribe_footers as footers
from engine.sending.statuses import Trigger
from engine.smtp.session import Peer
from engine.suppressions import scopes
from engine.webhooks import outbox
from storage import delivery, delivery_policies, destination_slots, emails
from storage import incidents as stored_incidents
from storage.codec import new_id
from storage.delivery import Unheld
from storage.emails import Email, Event, Recipient, RecipientUpdate
from storage.engines import pipelining
from storage.errors import DatabaseUnreachable, is_outage
from storage.suppressions import Suppression
from storage.tx import Tx

BATCH = 200
LARGE = 1024 * 1024  # octets of a submitted message that make it one round's large one
CONNECTIONS = policies.DEFAULT_CONNECTIONS  # per destination across every node, by default
IDLE_EXIT = timedelta(minutes=5)
SLOTS_POLL = timedelta(seconds=1)  # all slots taken elsewhere: look again at least this often
# A destination left for a less busy node (engine/delivery/throttle.py) is taken by this one
# at its first claim this long after, if nobody has taken it meanwhile.
STEER_GRACE = SLOTS_POLL

log = logging.getLogger("postroom.delivery")


@dataclass(frozen=True, slots=True)
class DomainQueueStatistics:
    domain: str
    rounds: int
    delivered: int
    deferred: int
    bounced: int
    failed: int
    in_flight: int = 0  # recipients claimed by the rounds under way


@dataclass(frozen=True, slots=True)
class Outcomes:
    """Outcomes of a round not written yet, taken to be written."""

    updates: list[RecipientUpdate]
    events: list[Event]
    bounces: list[tuple[str, Suppression]]
    now: datetime
    # Destination incidents: hits not recorded yet (one per pair and round), and pairs
    # delivered to without a hit (which resolve their open incident).
    hits: dict[stored_incidents.Pair, stored_incidents.Hit]
    delivered: set[stored_incidents.Pair]
    # The mailbox-full replies among them (indexes into these updates and events).
    mailboxes: FullMailboxes


class _Round:
    """The outcomes gathered in one delivery round. Each SMTP transaction's are written as it
    ends (`_Recording._commit`), while its connection goes on with the next one up to the
    server's 354, and sends that one's message only once they are written (`recorded`): a
    node that stops, stalls or dies leaves at most one transaction per connection delivered
    without its outcome. The rest (failures decided at the round's end) are written at the
    end, after every such write.

    Up to `writes` writes run at once (the database's writers), each taking every outcome
    settled and not taken when it starts. Writes may end in any order, so outcomes count as
    recorded only up to where the earliest write still under way began."""

    def __init__(self, now: datetime, writes: int) -> None:
        self.now = now
        self.updates: list[RecipientUpdate] = []
        self.events: list[Event] = []
        self.bounces: list[tuple[str, Suppression]] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.writing = trio.Semaphore(writes)  # writes of its outcomes under way at once
        self.write_queued = False  # a write is waiting for its turn: it takes what comes
        self.written: set[tuple[str, str]] = set()  # recipients whose outcome is written
        self.settled = 0  # outcomes settled so far
        self._handed = 0  # of which the writes started so far took (or dropped) so many
        self._under_way: set[int] = set()  # where the share of each write under way begins
        self.taken = 0  # of the outcomes settled, so many were handed to writes that ended
        self._progress = trio.Event()  # set when `taken` grows
        self._hits_written: set[stored_incidents.Pair] = set()
        self._resolved: set[stored_incidents.Pair] = set()
        self._numbered = 0  # events so far, to order a timeline recorded in parts
        # Per (workspace, sending domain): incidents hit, and deliveries (which resolve them).
        self.incidents: dict[stored_incidents.Pair, stored_incidents.Hit] = {}
        self.delivered: set[stored_incidents.Pair] = set()
        self.mailboxes = FullMailboxes()  # mailbox-full replies, counted when recorded

    def _event(
        self, email_id: str, workspace_id: str, kind: str, recipient: str, meta: dict[str, Any]
    ) -> None:
        # A microsecond apart, so a timeline reads in the order things happened (sent, then
        # delivered) even though the round records them all at once.
        at = self.now + timedelta(microseconds=self._numbered)
        self._numbered += 1
        self.events.append(Event(new_id(), email_id, workspace_id, kind, recipient, meta, at))

    def settle(self, email: Email, recipient: Recipient, outcome: Outcome) -> Verdict:
        """Record one recipient's outcome as `classify` decides it; the verdict."""
        decision = classify(outcome)
        peer = outcome.peer if isinstance(outcome, Replied) else None
        facts: dict[str, str] = {} if peer is None else {"policy": peer.policy}
        if isinstance(outcome, Unreachable) and outcome.policy is not None:
            facts["policy"] = outcome.policy
            if outcome.tls_policy:
                facts["reason"] = "tls_policy"
        self._apply(email, recipient, decision, peer, facts)
        self.settled += 1
        return decision.verdict

    def hand(self) -> int:
        """A write starts with the outcomes settled and not handed yet: where they begin."""
        begin, self._handed = self._handed, self.settled
        self._under_way.add(begin)
        return begin

    def done_with(self, begin: int) -> None:
        """The write handed the outcomes from `begin` has ended: written, kept for the
        database's return, or dropped with the leases."""
        self._under_way.discard(begin)
        taken = min(self._under_way, default=self._handed)
        if taken > self.taken:
            self.taken = taken
            self._progress.set()
            self._progress = trio.Event()

    async def recorded(self, upto: int) -> None:
        """Wait until a write has ended for the first `upto` outcomes settled."""
        while self.taken < upto:
            await self._progress.wait()

    def _apply(
        self,
        email: Email,
        recipient: Recipient,
        decision: Decision,
        peer: Peer | None = None,
        facts: dict[str, str] | None = None,  # a deferral's TLS policy, and why
    ) -> None:
        via = None if peer is None else peer.metadata()  # MX host, address, TLS facts
        self._gather(
            email.workspace_id,
            (email.workspace_id, email.domain_id),
            recipient,
            outcomes.effects(email, recipient, decision, self.now, via, facts),
        )

    def _gather(
        self,
        workspace_id: str,
        pair: stored_incidents.Pair,
        recipient: Recipient,
        done: outcomes.Effects,
    ) -> None:
        """Take one recipient's effects into the round's outcomes to write."""
        if done.mailbox_full:  # counted when recorded; its last event is the one it moves
            last = len(self.events) + len(done.events) - 1
            self.mailboxes.note_full(
                workspace_id, recipient.email_id, recipient.address, recipient.status,
                len(self.updates), last,
            )  # fmt: skip
        for kind, meta in done.events:
            self._event(recipient.email_id, workspace_id, kind, recipient.address, meta)
        self.updates.append(done.update)
        self.counts[done.update.status] += 1
        if done.suppression is not None:
            self.bounces.append((workspace_id, done.suppression))
        if done.incident is not None:
            self.incidents[pair] = done.incident
        if done.delivered:
            self.delivered.add(pair)
            self.mailboxes.note_delivered(workspace_id, recipient.address)

    def take(self) -> Outcomes | None:
        """The outcomes not yet written (None: none), no longer held here. A pair's incident
        is written once per round, with the first outcome that hit it, as the round's
        deferrals are (a reader never sees one without the other)."""
        hits = {p: h for p, h in self.incidents.items() if p not in self._hits_written}
        delivered = self.delivered - set(self.incidents) - self._resolved
        if not (self.updates or self.events or self.bounces or hits or delivered):
            return None
        taken = Outcomes(
            self.updates, self.events, self.bounces, self.now, hits, delivered, self.mailboxes
        )
        self.updates, self.events, self.bounces = [], [], []
        self.mailboxes = FullMailboxes()
        self.written.update((u.email_id, u.address) for u in taken.updates)
        self._hits_written.update(hits)
        self._resolved.update(delivered)
        return taken

    def recount(self, moved: list[tuple[str, str]]) -> None:
        """Count the outcomes a write turned into others (a mailbox full for days: bounced)."""
        for before, now in moved:
            self.counts[before] -= 1
            self.counts[now] += 1

    def unreadable(self, recipient: Recipient, workspace_id: str, error: str) -> None:
        """A recipient of an email whose stored row cannot be read: failed, nothing sent."""
        done = outcomes.unreadable(recipient, classify(Unbuildable(error)), error)
        # No sending domain known: it hits and resolves no incident.
        self._gather(workspace_id, (workspace_id, ""), recipient, done)


@dataclass(slots=True)
class _Prepared:
    """A claimed round, built and signed, waiting to be sent: its outcomes so far (emails
    that could not be built, late suppressions) and its transfers."""

    claim: throttle.Claimed
    outcome: _Round
    work: list[Transfer]
    token: object  # holds one of the router's rounds in flight
    epoch: int  # the node's tenure epoch it was claimed in (engine/platform/tenure.py)


def _release(tx: Tx, domain: str, slots: list[int], node: str) -> None:
    destination_slots.release(tx, domain, slots, node)


def _acquire(tx: Tx, key: str, limit: int, now: datetime, node: str) -> list[int]:
    return destination_slots.acquire(tx, key, limit, limit, node, now, now + LEASE)


def _write(
    tx: Tx, part: Outcomes | None, domain: str, node: str, unheld: Unheld | None = None
) -> list[tuple[str, str]]:
    """Write outcomes of recipients `node` still holds, and those `unheld` allows over
    recipients no node holds (storage/delivery.py fences the rest), with the destination
    incidents they opened, widened or resolved; the (status before, status now) of each
    outcome a mailbox full for days turned into a bounce."""
    if part is None:
        return []
    # Kept through an outage: only the full mailboxes of outcomes the fence lets through count
    # (a recipient another node took over meanwhile is that node's to count).
    among = None if unheld is None else delivery.writable(tx, part.updates, node, unheld)
    # Mailbox-full counts first: an address whose count runs out is bounced instead.
    moved = part.mailboxes.settle(tx, part.updates, part.events, part.bounces, part.now, among)
    hooks = outbox.ahead(tx, part.events)  # read with the recipients' UPDATE: one round trip
    recorded = delivery.record_outcomes(
        tx,
        part.updates,
        part.events,
        part.bounces,
        part.now,
        statuses.SUMMARISE,
        holder=node,
        unheld=unheld,
    )
    outbox.queue(tx, recorded, hooks)
    stored_incidents.record_round(
        tx, domain, part.hits, part.delivered, part.now, incidents.pause_for
    )
    return moved


@pipelining  # the delivery's hot write: its round trips are most of its time on PostgreSQL
def _record(
    tx: Tx, part: Outcomes | None, domain: str, released: list[int], node: str
) -> list[tuple[str, str]]:
    """A round's end: its last outcomes, and the slots it gives back."""
    moved = _write(tx, part, domain, node)
    destination_slots.release(tx, domain, released, node)
    return moved


@dataclass(frozen=True, slots=True)
class Kept:
    """Outcomes of finished SMTP transactions the database did not take (it was gone), kept
    by the router (engine/delivery/router.py; on disk across a stop,
    engine/delivery/kept_journal.py) until it answers again, under the key of the queue's
    connection slots (which its destination incidents are recorded for) and the node whose
    leases the recipients were claimed under."""

    key: str
    part: Outcomes
    node: str


def write_kept(tx: Tx, kept: Sequence[Kept], now: datetime) -> None:
    """Write outcomes kept through an outage, in the order they were kept. Those of recipients
    their node still holds are written as ever; when another node declared it dead meanwhile
    (or it stopped and its leases were freed), only those `statuses.UNHELD` allows over
    recipients no node holds: a success wins over a re-delivery scheduled elsewhere, never
    over one under way or done (no work resurrected). Their emails count as changed `now`,
    when the change commits, not when it happened: the updates feed goes by commit (its
    readers have gone on past the outage since)."""
    for each in kept:
        _write(tx, each.part, each.key, each.node, statuses.UNHELD)
    emails.touch(tx, {u.email_id for each in kept for u in each.part.updates}, now)


def _give_back(tx: Tx, claim: throttle.Claimed, node: str) -> None:
    """Give back a claim's recipients and slots untouched, those `node` holds."""
    keys = [(r.email_id, r.address) for r in claim.recipients]
    delivery_policies.unlease(tx, keys, holder=node)
    destination_slots.release(tx, claim.key, claim.slots, node)


def _record_faults(
    tx: Tx,
    recipients: list[Recipient],
    slots: list[int],
    error: str,
    domain: str,
    node: str,
    now: datetime,
) -> int:
    destination_slots.release(tx, domain, slots, node)
    quarantine = statuses.recipients_move(Trigger.GAVE_UP)
    quarantined = emails.record_faults(
        tx, recipients, error, now, faults.policy(now), statuses.SUMMARISE, quarantine, node
    )
    outbox.queue(tx, quarantined)
    return len(quarantined)


class _Rounds:
    """The router's rounds in flight this queue holds (one from a round's claim to its
    outcome), the memory budget each holds for its large message, and the recipients they
    claimed. Any still held when the queue stops (a round cut short by cancellation or an
    error) are given back, so the router never loses them."""

    def __init__(self, rt: Runtime, limiter: trio.CapacityLimiter) -> None:
        self._rt = rt
        self._limiter = limiter
        self._tokens: set[object] = set()
        self._memory: dict[object, int] = {}  # a round's share of the memory budget
        self.in_flight = 0  # recipients claimed by the rounds under way
        self.ended = trio.Event()  # a round in flight has ended since `watch`

    def watch(self) -> None:
        """Look for rounds ending from now on (`ended`)."""
        self.ended = trio.Event()

    async def take(self) -> object:
        """One of the router's rounds in flight, held by the token returned."""
        token = object()
        await self._limiter.acquire_on_behalf_of(token)
        self._tokens.add(token)
        return token

    def hold_memory(self, token: object, cost: int) -> None:
        self._memory[token] = cost

    def give(self, token: object) -> None:
        self._rt.message_memory.release(self._memory.pop(token, 0))
        self._tokens.discard(token)
        self._limiter.release_on_behalf_of(token)

    def started(self, claim: throttle.Claimed) -> None:
        self.in_flight += len(claim.recipients)

    def finish(self, claim: throttle.Claimed, token: object) -> None:
        self.in_flight -= len(claim.recipients)
        self.give(token)
        self.ended.set()

    def give_all(self) -> None:
        for token in list(self._tokens):
            self.give(token)


class _Writer:
    """The queue's outcomes writer: writes what rounds settle, with the slots given back, or
    keeps it for the router once the database failed a write (or is known gone)."""

    def __init__(
        self,
        rt: Runtime,
        domain: str,
        keep: Callable[[Kept], None],
        lose: Callable[[BaseException], None],
    ) -> None:
        self._rt = rt
        self._domain = domain
        self._keep = keep  # hands outcomes the database did not take to the router
        self.lose = lose  # the queue's: it drains
        # The outage error of the first write the database failed (or found it gone): from
        # then on the queue drains and keeps its outcomes, and `run` raises it at the end.
        self.lost: BaseException | None = None
        self.counts: dict[str, int] = defaultdict(int)  # outcomes written, by status

    async def write_or_keep(
        self, key: str, part: Outcomes | None, released: list[int]
    ) -> list[tuple[str, str]]:
        """Write `part` and give back the `released` slots (counted under `key`); the moves a
        mailbox full for days made. When the database fails the write, or failed one before,
        `part` goes to the router instead (`Kept`, no moves), written when the database
        answers, before this node delivers anything else; the slots are given back then, with
        every lease of its queues. Never raises an outage: the transactions under way on the
        other connections finish."""
        if self.lost is None:
            try:
                return await self._rt.db.write(_record, part, key, released, self._rt.node)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self.lose(exc)
        if part is not None:
            self._keep(Kept(key, part, self._rt.node))
        return []

    async def faulted(
        self,
        claim: throttle.Claimed,
        exc: Exception,
        key: str,
        slots: list[int],
        written: set[tuple[str, str]],
    ) -> None:
        """A round's step raised `exc`: count a fault on each of its recipients whose outcome
        is not `written` yet, to try them again later (three faults quarantine a recipient,
        engine/platform/faults.py), and give back `slots`."""
        rt = self._rt
        what = f"a round of {len(claim.recipients)} recipients at {self._domain}"
        error = rt.faults.item_fault("delivery", what, exc)
        quarantined = await rt.db.write(
            _record_faults,
            [r for r in claim.recipients if (r.email_id, r.address) not in written],
            list(dict.fromkeys(slots)),
            error,
            key,
            rt.node,
            rt.clock.now(),
        )
        rt.faults.quarantined("delivery", quarantined)

    def tally(self, outcome: _Round) -> None:
        for kind, count in outcome.counts.items():
            self.counts[kind] += count


class DomainQueue:
    """The delivery of one recipient domain: its scheduled side claims and builds rounds, its
    ready side hands them to an egress, and its writer records their outcomes."""

    def __init__(
        self,
        rt: Runtime,
        domain: str,
        egress: SourcedEgress,
        routes: Routes,
        rounds: trio.CapacityLimiter,
        keep: Callable[[Kept], None],
        latency: LatencyHistogram | None = None,
    ) -> None:
        self._rt = rt
        self.domain = domain
        self.draining = False
        self._claiming = trio.CancelScope()  # the scheduled side's, cancelled by a drain
        self.rounds = _Rounds(rt, rounds)
        self.writer = _Writer(rt, domain, keep, self.lose)
        # Accept -> 250 per delivered recipient, shared by the router's queues (for /metrics).
        latency = latency or LatencyHistogram()
        self.routes = routes
        self.ready = _Ready(rt, self, egress, routes, latency)
        self.scheduled = _Scheduled(rt, self)

    def wake(self) -> None:
        self.scheduled.woken.set()
        self.ready.woken.set()

    def drain(self) -> None:
        """Stop: claim nothing more and start no other transaction; the transactions under
        way finish, their outcomes are written, the connections QUIT and `run` returns. What
        was claimed and not sent keeps its lease until the node gives back all it holds."""
        self.draining = True
        self._claiming.cancel()
        self.wake()

    def lose(self, exc: BaseException) -> None:
        """The database failed a write (or is known gone): the node cannot record what it
        sends, so the queue drains. The transactions under way finish, and their outcomes,
        with every other one not written yet, are kept (`_Writer.write_or_keep`)."""
        if self.writer.lost is None:
            self.writer.lost = exc
        self.drain()

    def can_record(self) -> bool:
        """Whether the queue may go on sending: not draining, and (noted now) not lost."""
        down_for = self._rt.db.unreachable_for()
        if down_for is not None:
            self.lose(DatabaseUnreachable(down_for))
        return not self.draining

    async def run(self) -> None:
        """Deliver until there has been no work for IDLE_EXIT. Raise the outage once drained
        when the database was lost (for the router to know its outcomes are kept)."""
        send, receive = trio.open_memory_channel[_Prepared](0)  # at most one round ahead
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self.ready.run, receive)
                async with send:
                    with self._claiming:
                        try:
                            await self.scheduled.run(send)
                        except Exception as exc:
                            # Raising here would cut the ready side's transactions: it drains.
                            if not is_outage(exc):
                                raise
                            self.lose(exc)
            if self.writer.lost is not None:
                raise self.writer.lost
        finally:
            self.rounds.give_all()
            await self.ready.egress.abandon()

    def statistics(self) -> DomainQueueStatistics:
        c = self.writer.counts
        return DomainQueueStatistics(
            self.domain,
            self.scheduled.rounds,
            c["delivered"],
            c["deferred"],
            c["bounced"],
            c["failed"],
            self.rounds.in_flight,
        )


class _Scheduled:
    """The scheduled side of a queue (one task): claims due recipients with a lease as the
    destination's policies allow, loads their emails and builds and signs their messages
    (in a worker thread), one round ahead of the ready side."""

    def __init__(self, rt: Runtime, queue: DomainQueue) -> None:
        self.rt = rt
        self._queue = queue
        self.woken = trio.Event()
        self.rounds = 0  # rounds claimed with recipients
        self.preparing = False  # the next round is claimed and being built
        # What policies match (MX hosts), the key its connection slots are counted under
        # (decided by its first claim, kept while it runs) and the connection limit of the
        # last round that claimed recipients.
        self._destination: throttle.Destination | None = None
        self._slot_key: str | None = None
        # The key was decided before the MX hosts were known: decided again once no slot
        # is held under it.
        self._rekey = False
        self._connections = CONNECTIONS
        self._yielded_at: datetime | None = None  # when it last left the site to another node

    async def run(self, send: trio.MemorySendChannel[_Prepared]) -> None:
        rt, queue = self.rt, self._queue
        rounds, ready = queue.rounds, queue.ready
        clock = rt.clock
        while True:
            # Reset before claiming: a wake-up or a round ending meanwhile is not lost.
            self.woken = trio.Event()
            rounds.watch()
            # A round holds one of the router's slots from its claim to its outcome: with a
            # long backlog over many domains, only so many batches are built and held at once.
            token = await rounds.take()
            try:
                now = clock.now()
                destination = await self._destination_now(now)
                epoch = rt.tenure.epoch
                yielded_at = self._yielded_at
                steer = yielded_at is None or now - yielded_at < STEER_GRACE
                claim = await rt.db.write(
                    throttle.claim,
                    destination,
                    self._slot_key,
                    self._connections,
                    ready.held(),
                    rt.node,
                    now,
                    now + LEASE,
                    BATCH,
                    rt.delivery_caps,
                    steer,
                )
            except BaseException:
                rounds.give(token)
                raise
            self._slot_key, self._connections = claim.key, claim.connections
            self._yielded_at = (yielded_at or now) if claim.yielded else None
            if claim.recipients and epoch != rt.tenure.epoch:
                # The node was found dead while it claimed: whether the claim came before
                # the reaping (its leases freed since) or after (they are this node's), it is
                # given back; what is still this node's is claimed again in the new epoch.
                rounds.give(token)
                await rt.db.write(_give_back, claim, rt.node)
                continue
            if not claim.recipients:
                rounds.give(token)
                if rounds.in_flight:
                    # A round is still out: its recipients, leased now, may come back due,
                    # so look again once it has ended rather than sleep or stop.
                    await rounds.ended.wait()
                    continue
                # Slots kept by the ready side for a round that never came (building it
                # failed): nothing is in flight, so it is idle and they go back now.
                await ready.release_kept()
            else:
                rounds.started(claim)
                self.preparing = True
                try:
                    prepared = await self._built(claim, token, epoch)
                    if prepared is not None:
                        await send.send(prepared)
                        del prepared  # the ready side owns it now (with the built messages)
                finally:
                    self.preparing = False
                continue
            if claim.slots_busy:
                wait_until = now + SLOTS_POLL
            else:
                wait_until = claim.next_due if claim.next_due is not None else now + IDLE_EXIT
            with trio.move_on_at(clock.deadline_for(wait_until)):
                await self.woken.wait()
            if claim.next_due is None and not claim.slots_busy and not self.woken.is_set():
                return

    async def _destination_now(self, now: datetime) -> throttle.Destination:
        """What the next round is claimed for. The MX hosts are looked up once mail due
        here leaves through the network, and kept while the queue runs; mail that the
        router sends elsewhere alone (the sandbox's, which promises that nothing leaves the
        machine) asks no DNS. Until they are known, rounds go by recipient-domain rules."""
        rt, queue = self.rt, self._queue
        if self._destination is None:
            due = await rt.db.read(emails.due_email_ids, queue.domain, now, BATCH)
            if not await queue.routes.all_elsewhere(due):
                self._destination = await throttle.destination(rt, queue.domain)
                self._rekey = self._destination is not None and self._slot_key is not None
        if self._rekey and not queue.ready.held() and not queue.rounds.in_flight:
            self._slot_key, self._rekey = None, False
        return self._destination or throttle.Destination(queue.domain, ())

    async def _built(self, claim: throttle.Claimed, token: object, epoch: int) -> _Prepared | None:
        """The round prepared; None when preparing it raised for its items (a fault counted
        on each recipient, the round's slots given back)."""
        try:
            return await self._prepare(claim, token, epoch)
        except Exception as exc:
            if not faults.blames_item(exc):
                raise
            await self._queue.writer.faulted(claim, exc, claim.key, list(claim.slots), set())
            self._queue.rounds.finish(claim, token)
            return None

    async def _prepare(self, claim: throttle.Claimed, token: object, epoch: int) -> _Prepared:
        """Load the round's emails and build and sign their messages (in a worker thread)."""
        rt = self.rt
        self.rounds += 1
        by_email: dict[str, list[Recipient]] = defaultdict(list)
        for recipient in claim.recipients:
            by_email[recipient.email_id].append(recipient)
        data = await rt.db.read(delivery.load_round, claim.recipients, LARGE)
        if data.large:
            data = await self._take_large(data, by_email, token)
        # Only those suppressed since that this email may not reach: an unsubscribe stops
        # only mail that offers one (engine/suppressions/scopes.py).
        data = replace(
            data,
            emails=[
                (email, domain, scopes.blocking(late, subscribed=email.unsubscribe))
                for email, domain, late in data.emails
            ],
        )
        links = LinkSettings(rt.public_url, rt.secret_key, rt.smtp_host)
        to_build = [
            ToBuild(
                email,
                domain,
                footers.footer_of(data.footers.get(email.workspace_id)),
                [r.address for r in by_email[email.id] if r.address not in late],
            )
            for email, domain, late in data.emails
        ]
        built = await trio.to_thread.run_sync(build_all, to_build, links)
        outcome = _Round(rt.clock.now(), rt.db.writers)
        for email_id, unreadable in data.unreadable.items():
            for recipient in by_email[email_id]:
                outcome.unreadable(recipient, unreadable.workspace_id, unreadable.error)
        work: list[Transfer] = []
        for email, _, late in data.emails:
            messages = built[email.id]
            recipients = []
            for recipient in by_email[email.id]:
                if recipient.address in late:
                    outcome.settle(email, recipient, SuppressedSince(late[recipient.address]))
                elif isinstance(messages, str):
                    outcome.settle(email, recipient, Unbuildable(messages))
                else:
                    recipients.append(recipient)
            if recipients and not isinstance(messages, str):
                # The submitted message is in the built one now: not kept twice.
                email = replace(email, raw=None)
                for message in messages:
                    mine = [r for r in recipients if message.recipient in (None, r.address)]
                    chosen = claim.sources.get(email.id)
                    source = (
                        None if chosen is None else Source(chosen.ehlo_name, chosen.bind_address)
                    )
                    work.append(Transfer(email, mine, message, source))
        return _Prepared(claim, outcome, work, token, epoch)

    async def _take_large(
        self, data: delivery.RoundData, by_email: dict[str, list[Recipient]], token: object
    ) -> delivery.RoundData:
        """Keep one submitted message larger than LARGE in the round, read once the
        process's memory budget has room for it (held until the round ends, with its
        `token`); the recipients of the others go back, due at once, for the next rounds:
        eight 34 MiB messages are never read, built and signed at once."""
        rt = self.rt
        kept = next(iter(data.large))
        put_back = [r for i in data.large if i != kept for r in by_email[i]]
        if put_back:
            await rt.db.write(emails.give_back, put_back, rt.node)
        memory = rt.message_memory
        cost = memory.cost(data.large[kept])
        await memory.acquire(cost)
        self._queue.rounds.hold_memory(token, cost)
        raw = await rt.db.read(emails.raw_of, kept)
        return replace(
            data,
            emails=[
                (replace(email, raw=raw) if email.id == kept else email, domain, late)
                for email, domain, late in data.emails
                if email.id == kept or email.id not in data.large
            ],
            large={},
        )


class _Ready:
    """The ready side of a queue (one task): holds the destination's connection slots (across
    every node, storage/destination_slots.py), hands each prepared round to the egress its
    transfers are routed to, and has its outcomes written. It keeps the slots, and the
    egress its open connections, from one round to the next while another round is ready,
    and gives them back with the outcomes of the last one."""

    def __init__(
        self,
        rt: Runtime,
        queue: DomainQueue,
        egress: SourcedEgress,
        routes: Routes,
        latency: LatencyHistogram,
    ) -> None:
        self._rt = rt
        self._queue = queue
        self.egress = egress
        self._routes = routes
        self._latency = latency
        self.woken = trio.Event()  # a wake-up: slots may have been freed elsewhere
        self._slots: list[int] = []
        self._key: str | None = None  # what the slots held are counted under

    def held(self) -> int:
        """How many connection slots it holds."""
        return len(self._slots)

    async def run(self, receive: trio.MemoryReceiveChannel[_Prepared]) -> None:
        scheduled = self._queue.scheduled
        async with receive:
            async for prepared in receive:
                # Keep the slots and connections for the next round if one is on its way.
                def next_round() -> bool:
                    return scheduled.preparing or receive.statistics().tasks_waiting_send > 0

                await self._guarded(prepared, next_round)
                # Not kept while waiting for the next round: it holds the built messages.
                del prepared

    async def _guarded(self, prepared: _Prepared, next_round: Callable[[], bool]) -> None:
        """Deliver a round; if that raises for its items, count a fault on each recipient
        whose outcome is not written yet, and give back the slots and connections."""
        try:
            await self._deliver(prepared, next_round)
        except Exception as exc:
            if not faults.blames_item(exc):
                raise
            claim = prepared.claim
            slots, self._slots = [*self._slots, *claim.slots], []
            self.egress.close()
            written = prepared.outcome.written
            await self._queue.writer.faulted(claim, exc, claim.key, slots, written)
            self._queue.rounds.finish(claim, prepared.token)

    async def _deliver(self, prepared: _Prepared, next_round: Callable[[], bool]) -> None:
        queue, writer = self._queue, self._queue.writer
        claim, outcome, work = prepared.claim, prepared.outcome, prepared.work
        tenure = self._rt.tenure
        if writer.lost is None and not await tenure.hold(prepared.epoch):
            await self._drop(prepared)
            return
        # The round may have waited for the one before it: its outcomes happen from now.
        outcome.now = self._rt.clock.now()
        self._key = claim.key
        self._slots += claim.slots
        if work and not self._slots:  # the round before gave its slots back meanwhile
            await self._wait_for_slots(claim.connections)
        if work and self._slots and not queue.draining:
            lanes = Lanes(min(len(self._slots), claim.connections), claim.per_connection)
            async with trio.open_nursery() as writes:
                record = _Recording(self._rt, queue, outcome, prepared, writes, self._latency)
                try:
                    for egress, batch in await self._routes.route(work, self.egress):
                        await egress.send(batch, record, lanes)
                except Exception as exc:
                    # What is sent could not be recorded: the queue drains, sending nothing.
                    if not is_outage(exc):
                        raise
                    queue.lose(exc)
        # Keep the slots and connections for the next round if one is on its way; else
        # give them back with this round's outcomes.
        keep = next_round() and not queue.draining
        released = [] if keep else self._slots
        async with outcome.writing:
            # The node stalled while it sent (kept outcomes are fenced when written).
            if writer.lost is None and not await tenure.hold(prepared.epoch):
                await self._drop(prepared)
                return
            outcome.recount(await writer.write_or_keep(claim.key, outcome.take(), released))
        if not keep:
            self._slots = []
            self.egress.close()
        queue.rounds.finish(claim, prepared.token)
        writer.tally(outcome)

    async def _drop(self, prepared: _Prepared) -> None:
        """Give up a round claimed in an epoch that ended (engine/platform/tenure.py): the
        node was declared dead, what it held was freed and may be being delivered elsewhere,
        so nothing more of the round is sent or written. The slots went with the leases."""
        log.warning(
            "dropping a round of %d recipients at %s: this node was declared dead since"
            " it claimed them, and another node may be delivering them",
            len(prepared.claim.recipients),
            self._queue.domain,
        )
        self._slots = []
        self.egress.close()
        self._queue.rounds.finish(prepared.claim, prepared.token)

    async def _wait_for_slots(self, limit: int) -> None:
        """Take free connection slots, waiting for a release when all are taken elsewhere."""
        rt, key = self._rt, self._key or self._queue.domain
        clock = rt.clock
        while not self._slots and not self._queue.draining:
            self.woken = trio.Event()
            now = clock.now()
            self._slots = await rt.db.write(_acquire, key, limit, now, rt.node)
            if not self._slots:
                with trio.move_on_at(clock.deadline_for(now + SLOTS_POLL)):
                    await self.woken.wait()

    async def release_kept(self) -> None:
        """Give back the slots (and connections) kept for a round that never came."""
        if not self._slots:
            return
        slots, self._slots = self._slots, []
        self.egress.close()
        key = self._key or self._queue.domain
        await self._rt.db.write(_release, key, slots, self._rt.node)


class _Recording:
    """A round's `Record` for the egresses it is routed to: settles their outcomes into the
    round, has each SMTP transaction's written as it ends (in `writes`, while its
    connection goes on), and fences each transaction start on the node's tenure."""

    def __init__(
        self,
        rt: Runtime,
        queue: DomainQueue,
        outcome: _Round,
        prepared: _Prepared,
        writes: trio.Nursery,
        latency: LatencyHistogram,
    ) -> None:
        self._rt = rt
        self._queue = queue
        self._outcome = outcome
        self._key = prepared.claim.key
        self._epoch = prepared.epoch
        self._writes = writes
        self._latency = latency

    def settle(self, email: Email, recipient: Recipient, outcome: Outcome) -> Verdict:
        # Stamped as of now: an egress may answer long after the round began (a slow
        # server, a sandbox script that waits), and `sent` must say when it went.
        self._outcome.now = self._rt.clock.now()
        return self._outcome.settle(email, recipient, outcome)

    def transaction(self, transfer: Transfer, outcomes: Sequence[Outcome]) -> int:
        round_ = self._outcome
        round_.now = self._rt.clock.now()
        for recipient, outcome in zip(transfer.recipients, outcomes, strict=True):
            verdict = round_.settle(transfer.email, recipient, outcome)
            peer = outcome.peer if isinstance(outcome, Replied) else None
            if verdict is Verdict.DELIVERED and peer is not None:
                self._latency.observe((round_.now - recipient.queued_at).total_seconds())
                tls = tls_counts.outcome(peer.tls_version, peer.tls_verified)
                self._rt.tls_deliveries.note(peer.policy, tls)
        if not round_.write_queued:  # else a write waiting already takes these too
            round_.write_queued = True
            self._writes.start_soon(self._commit)
        return round_.settled  # the write just asked for takes them all

    async def recorded(self, upto: int) -> None:
        await self._outcome.recorded(upto)

    async def may_start(self) -> bool:
        """The queue is not draining, the database is not known gone (then the queue drains
        as on a failed write: what it sends could not be recorded) and the node still holds
        the round's leases (engine/platform/tenure.py; asked again after waiting for a
        heartbeat)."""
        if not self._queue.can_record():
            return False
        return await self._rt.tenure.hold(self._epoch) and self._queue.can_record()

    def stopping(self) -> bool:
        return self._queue.draining

    async def _commit(self) -> None:
        """Write the outcomes settled so far. Transactions that end while the database's
        writers are all busy with the round's share the next write: it writes everything
        settled until its turn comes."""
        outcome, writer = self._outcome, self._queue.writer
        async with outcome.writing:
            outcome.write_queued = False
            # Not held: the leases were freed, the outcomes are not this node's to write.
            held = writer.lost is not None or await self._rt.tenure.hold(self._epoch)
            begin = outcome.hand()
            try:
                part = outcome.take() if held else None
                if part is not None:
                    outcome.recount(await writer.write_or_keep(self._key, part, []))
            finally:
                outcome.done_with(begin)
