"""`DomainQueue`: the actor that delivers every recipient of one domain.

It works in rounds: claim up to `BATCH` due recipients with a lease, load their emails
(storage/delivery.py: a fixed number of queries per round), build and DKIM-sign their
messages in a worker thread, then send them over up to `CONNECTIONS` parallel SMTP
connections, each reused for message after message and opportunistically upgraded with
STARTTLS (a failed handshake is retried once in plain text) unless the domain's MTA-STS
policy demands verified TLS (engine/delivery/mta_sts.py: then never plain text, and a host
the policy does not allow is passed over, `tls_policy`) or DANE covers the MX host
(engine/delivery/dane.py: TLS matching its TLSA records or nothing; DANE wins over MTA-STS
for the hosts it covers, RFC 8461 2), and record the whole round's
outcomes in one unit of work. Every attempt's end is a typed outcome that
engine/delivery/classify.py alone turns into delivered, deferred, bounced, refused, failed or
a destination incident, which the round's unit opens, widens or resolves per sending domain
(engine/delivery/incidents.py).

Rounds are pipelined: while one round is on the wire, the next one is claimed, loaded, built
and signed (RSA runs without the GIL, so the signing really overlaps the sending). At most
one round waits ahead of the one sending, and each holds one of the router's
`ROUNDS_IN_FLIGHT` from its claim to its outcome.

The destination's connection limit (`CONNECTIONS` unless a destination policy says otherwise)
holds across every node: connections are opened only for connection slots of the destination
held in the database (storage/destination_slots.py); the claim applies the policies' limits
and rate budgets (engine/delivery/throttle.py). The queue keeps the
slots, and the open connections, from one round to the next while another round is ready,
and gives them back with the outcomes of the last one; a node finding every slot taken
elsewhere claims nothing and waits for a release.

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
import ssl
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable, Iterable, Sequence, Sized
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import trio

from engine.delivery import dane, incidents, mta_sts, mx, policies, retry, throttle
from engine.delivery.classify import (
    Decision,
    DnsFailure,
    NoMailService,
    Outcome,
    PrivateTargets,
    Replied,
    SessionRefused,
    SuppressedSince,
    Unbuildable,
    Unreachable,
    Verdict,
    classify,
)
from engine.delivery.full_mailboxes import FullMailboxes
from engine.delivery.latency import LatencyHistogram
from engine.delivery.messages import LinkSettings, ToBuild, WireMessage, build_all
from engine.platform import dns as lookups
from engine.platform import faults, outbound_http, tls_counts
from engine.platform.nodes import LEASE
from engine.platform.runtime import Runtime
from engine.sandbox import capture as sandbox_capture
from engine.sending import statuses
from engine.sending import unsubscribe_footers as footers
from engine.sending.statuses import Trigger
from engine.smtp.errors import PermanentFailure, SmtpError, TlsFailure
from engine.smtp.session import Peer, SmtpSession, connect
from engine.suppressions import scopes
from engine.webhooks import outbox
from storage import delivery, delivery_policies, destination_slots, emails
from storage import incidents as stored_incidents
from storage.codec import new_id
from storage.delivery import Unheld
from storage.egress import Source
from storage.emails import Email, Event, Recipient, RecipientUpdate
from storage.errors import DatabaseUnreachable, is_outage
from storage.suppressions import Suppression
from storage.tx import Tx

BATCH = 200
LARGE = 1024 * 1024  # octets of a submitted message that make it one round's large one
CONNECTIONS = policies.DEFAULT_CONNECTIONS  # per destination across every node, by default
IDLE_EXIT = timedelta(minutes=5)
SLOTS_POLL = timedelta(seconds=1)  # all slots taken elsewhere: look again at least this often
QUIT_WAIT = 5.0  # seconds a server gets to answer QUIT

log = logging.getLogger("postroom.delivery")
T = TypeVar("T")


def opportunistic_tls() -> ssl.SSLContext:
    """STARTTLS as MTAs use it between each other: encrypt when offered, verify nothing.
    (No CA store is loaded: nothing is verified, and loading it costs ~45 ms per queue.)"""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
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
    in_flight: int = 0  # recipients claimed by the rounds under way


@dataclass(frozen=True, slots=True)
class _Outcomes:
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
    ends (`_commit`), while its connection goes on with the next one up to the server's 354,
    and sends that one's message only once they are written (`recorded`): a node that stops,
    stalls or dies leaves at most one transaction per connection delivered without its
    outcome. The rest (failures decided at the round's end) are written at the end, after
    every such write."""

    def __init__(self, now: datetime) -> None:
        self.now = now
        self.updates: list[RecipientUpdate] = []
        self.events: list[Event] = []
        self.bounces: list[tuple[str, Suppression]] = []
        self.counts: dict[str, int] = defaultdict(int)
        self.writing = trio.Lock()  # one write of its outcomes at a time, in order
        self.write_queued = False  # a write is waiting for the lock: it takes what comes
        self.written: set[tuple[str, str]] = set()  # recipients whose outcome is written
        self.settled = 0  # outcomes settled so far
        self.taken = 0  # of which a write took (or dropped: the leases were lost) so many
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

    def done_with(self, upto: int) -> None:
        """A write has ended for the outcomes settled before `upto`: written, kept for the
        database's return, or dropped with the leases."""
        if upto > self.taken:
            self.taken = upto
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
        address, response = recipient.address, decision.response
        meta: dict[str, Any] = {"subject": email.subject, "tags": email.tags}

        def event(kind: str, **more: Any) -> None:
            self._event(email.id, email.workspace_id, kind, address, meta | more)

        def update(trigger: Trigger, when: datetime | None = None) -> None:
            status = statuses.recipient_next(recipient.status, trigger)
            self.updates.append(RecipientUpdate(email.id, address, status, when, response))
            self.counts[status] += 1

        verdict = decision.verdict
        pair = (email.workspace_id, email.domain_id)
        if verdict is Verdict.DELIVERED:
            event("sent", domain=recipient.domain)
            via = {} if peer is None else peer.metadata()  # MX host, address, TLS facts
            event("delivered", domain=recipient.domain, smtp_response=response, **via)
            update(Trigger.ACCEPTED_BY_MX)
            self.delivered.add(pair)
            self.mailboxes.note_delivered(email.workspace_id, address)
        elif verdict is Verdict.UNDELIVERABLE:
            # Refused for the message (size, content, format, a policy), not the recipient.
            blamed = None if decision.blame is None else decision.blame.value
            event("failed", error=response, dsn=decision.dsn, response=response, blame=blamed)
            update(Trigger.UNDELIVERABLE)
        elif verdict in (Verdict.BOUNCED, Verdict.REFUSED):
            refused = verdict is Verdict.REFUSED
            # A refusal of our session says nothing about the address: no suppression.
            blame = {"blame": "destination"} if refused else {}
            event("bounced", dsn=decision.dsn, response=response, bounce_type="hard", **blame)
            update(Trigger.PERMANENT)
            if not refused:
                entry = Suppression(address, "hard_bounce", self.now, email.id)
                self.bounces.append((email.workspace_id, entry))
        elif verdict in (Verdict.DEFERRED, Verdict.INCIDENT, Verdict.SOFT_BOUNCED):
            if decision.incident is not None:
                # The sending side's problem: the recipient waits, the destination pauses.
                meta["incident"] = decision.incident.value
                sending_domain = email.from_address.rpartition("@")[2].lower()
                hit = stored_incidents.Hit(decision.incident.value, sending_domain, response)
                self.incidents[pair] = hit
            # Time spent held or waiting for a policy budget is not counted (expiry_from).
            since = recipient.expiry_from or recipient.queued_at
            when = retry.next_attempt(recipient.attempts + 1, since, self.now)
            if verdict is Verdict.SOFT_BOUNCED:  # mailbox full: counted when recorded
                meta |= {"bounce_type": "soft", "dsn": decision.dsn}
                self.mailboxes.note_full(
                    email.workspace_id, email.id, address, recipient.status,
                    len(self.updates), len(self.events),
                )  # fmt: skip
            if when is None:
                event("failed", error=f"gave up after 72 hours: {response}")
                update(Trigger.GAVE_UP)
            else:
                facts = facts or {}
                event("deferred", response=response, next_attempt_at=when.isoformat(), **facts)
                update(Trigger.TEMPORARY, when)
        else:
            event("failed", error=response)
            update(Trigger.GAVE_UP)

    def take(self) -> _Outcomes | None:
        """The outcomes not yet written (None: none), no longer held here. A pair's incident
        is written once per round, with the first outcome that hit it, as the round's
        deferrals are (a reader never sees one without the other)."""
        hits = {p: h for p, h in self.incidents.items() if p not in self._hits_written}
        delivered = self.delivered - set(self.incidents) - self._resolved
        if not (self.updates or self.events or self.bounces or hits or delivered):
            return None
        taken = _Outcomes(
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
        decision = classify(Unbuildable(error))
        address = recipient.address
        self._event(recipient.email_id, workspace_id, "failed", address, {"error": error})
        status = statuses.recipient_next(recipient.status, Trigger.GAVE_UP)
        self.updates.append(
            RecipientUpdate(recipient.email_id, address, status, None, decision.response)
        )
        self.counts[status] += 1


@dataclass(frozen=True, slots=True)
class _Transfer:
    """One email to its recipients at this domain: one SMTP transaction."""

    email: Email
    recipients: list[Recipient]
    message: WireMessage
    source: Source | None = None  # the egress source it leaves from (None: the default)


@dataclass(slots=True)
class _Prepared:
    """A claimed round, built and signed, waiting to be sent: its outcomes so far (emails
    that could not be built, late suppressions) and its transfers."""

    claim: throttle.Claimed
    outcome: _Round
    work: list[_Transfer]
    token: object  # holds one of the router's rounds in flight
    epoch: int  # the node's tenure epoch it was claimed in (engine/platform/tenure.py)


def _release(tx: Tx, domain: str, slots: list[int], node: str) -> None:
    destination_slots.release(tx, domain, slots, node)


def _acquire(tx: Tx, key: str, limit: int, now: datetime, node: str) -> list[int]:
    return destination_slots.acquire(tx, key, limit, limit, node, now, now + LEASE)


def _write(
    tx: Tx, part: _Outcomes | None, domain: str, node: str, unheld: Unheld | None = None
) -> list[tuple[str, str]]:
    """Write outcomes of recipients `node` still holds, and those `unheld` allows over
    recipients no node holds (storage/delivery.py fences the rest), with the destination
    incidents they opened, widened or resolved; the (status before, status now) of each
    outcome a mailbox full for days turned into a bounce."""
    if part is None:
        return []
    # Mailbox-full counts first: an address whose count runs out is bounced instead.
    moved = part.mailboxes.settle(tx, part.updates, part.events, part.bounces, part.now)
    delivery.record_outcomes(
        tx,
        part.updates,
        part.events,
        part.bounces,
        part.now,
        statuses.SUMMARISE,
        outbox.queue,
        holder=node,
        unheld=unheld,
    )
    stored_incidents.record_round(
        tx, domain, part.hits, part.delivered, part.now, incidents.pause_for
    )
    return moved


def _record(
    tx: Tx, part: _Outcomes | None, domain: str, released: list[int], node: str
) -> list[tuple[str, str]]:
    """A round's end: its last outcomes, and the slots it gives back."""
    moved = _write(tx, part, domain, node)
    destination_slots.release(tx, domain, released, node)
    return moved


@dataclass(frozen=True, slots=True)
class Kept:
    """Outcomes of finished SMTP transactions the database did not take (it was gone), kept
    in memory by the router (engine/delivery/router.py) until it answers again, under the key
    of the queue's connection slots (which its destination incidents are recorded for)."""

    key: str
    part: _Outcomes


def write_kept(tx: Tx, kept: Sequence[Kept], node: str) -> None:
    """Write outcomes kept through an outage, in the order they were kept. Those of recipients
    `node` still holds are written as ever; when another node declared it dead meanwhile,
    only those `statuses.UNHELD` allows over recipients no node holds: a success wins over a
    re-delivery scheduled elsewhere, never over one under way or done (no work resurrected)."""
    for each in kept:
        _write(tx, each.part, each.key, node, statuses.UNHELD)


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
    return emails.record_faults(
        tx, recipients, error, now, faults.policy(now), statuses.SUMMARISE, outbox.queue, quarantine
    )


class DomainQueue:
    def __init__(
        self,
        rt: Runtime,
        domain: str,
        tls: ssl.SSLContext,
        rounds: trio.CapacityLimiter,
        keep: Callable[[Kept], None],
        latency: LatencyHistogram | None = None,
    ) -> None:
        self._rt = rt
        self.domain = domain
        self._tls = tls
        self._policies = mta_sts.Policies(rt, domain)
        self._policy: mta_sts.Policy | None = None  # the domain's MTA-STS policy this round
        self._dane: dane.Hosts = {}  # the MX hosts DANE covers this round
        self._rounds_in_flight = rounds
        self._keep = keep  # hands outcomes the database did not take to the router
        # What policies match (MX hosts), the key its connection slots are counted under
        # (decided by its first claim, kept while it runs) and the connection limit of the
        # last round that claimed recipients.
        self._destination: throttle.Destination | None = None
        self._slot_key: str | None = None
        self._connections = CONNECTIONS
        self._uses: dict[int, int] = {}  # messages sent on each kept session, by id
        # Accept -> 250 per delivered recipient, shared by the router's queues (for /metrics).
        self._latency = latency or LatencyHistogram()
        self._in_flight = 0
        self._woken = trio.Event()
        self._rounds = 0
        self._counts: dict[str, int] = defaultdict(int)
        # Connection slots the sender holds between rounds, and the sessions open on them.
        self._slots: list[int] = []
        self._sessions: list[SmtpSession] = []
        self._preparing = False  # the next round is claimed and being built
        self._settled = trio.Event()  # a round in flight has ended since the last claim
        # The router's rounds this queue holds; any still held when it stops (a round cut
        # short by cancellation or an error) are given back, so the router never loses them.
        self._round_tokens: set[object] = set()
        self._round_memory: dict[object, int] = {}  # a round's share of the memory budget
        self._draining = False
        self._claiming = trio.CancelScope()  # the preparer's, cancelled by a drain
        # The outage error of the first write the database failed (or found it gone): from
        # then on the queue drains and keeps its outcomes, and `run` raises it at the end.
        self._lost: BaseException | None = None

    def wake(self) -> None:
        self._woken.set()

    def drain(self) -> None:
        """Stop: claim nothing more and start no other transaction; the transactions under
        way finish, their outcomes are written, the connections QUIT and `run` returns. What
        was claimed and not sent keeps its lease until the node gives back all it holds."""
        self._draining = True
        self._claiming.cancel()
        self._woken.set()

    def _lose(self, exc: BaseException) -> None:
        """The database failed a write (or is known gone): the node cannot record what it
        sends, so the queue drains. The transactions under way finish, and their outcomes,
        with every other one not written yet, are kept (`_write_or_keep`)."""
        if self._lost is None:
            self._lost = exc
        self.drain()

    async def run(self) -> None:
        """Deliver until there has been no work for IDLE_EXIT. Raise the outage once drained
        when the database was lost (for the router to know its outcomes are kept)."""
        send, receive = trio.open_memory_channel[_Prepared](0)  # at most one round ahead
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._sender, receive)
                async with send:
                    with self._claiming:
                        try:
                            await self._preparer(send)
                        except Exception as exc:
                            # Raising here would cut the sender's transactions: it drains.
                            if not is_outage(exc):
                                raise
                            self._lose(exc)
            if self._lost is not None:
                raise self._lost
        finally:
            for token in list(self._round_tokens):
                self._give_round(token)
            # Stopping: connections kept for a next round are closed without waiting on QUIT.
            sessions, self._sessions = self._sessions, []
            with trio.CancelScope(shield=True), trio.move_on_after(1):
                for session in sessions:
                    await session.aclose()

    # -- claiming and building (one round ahead) -----------------------------------------

    async def _preparer(self, send: trio.MemorySendChannel[_Prepared]) -> None:
        clock = self._rt.clock
        while True:
            # Reset before claiming: a wake-up or a round ending meanwhile is not lost.
            self._woken, self._settled = trio.Event(), trio.Event()
            # A round holds one of the router's slots from its claim to its outcome: with a
            # long backlog over many domains, only so many batches are built and held at once.
            token = await self._take_round()
            try:
                if self._destination is None:
                    self._destination = await throttle.destination(self._rt, self.domain)
                destination = self._destination or throttle.Destination(self.domain, ())
                now = clock.now()
                epoch = self._rt.tenure.epoch
                claim = await self._rt.db.write(
                    throttle.claim,
                    destination,
                    self._slot_key,
                    self._connections,
                    len(self._slots),
                    self._rt.node,
                    now,
                    now + LEASE,
                    BATCH,
                    self._rt.delivery_caps,
                )
            except BaseException:
                self._give_round(token)
                raise
            self._slot_key, self._connections = claim.key, claim.connections
            if claim.recipients and epoch != self._rt.tenure.epoch:
                # The node was found dead while it claimed: whether the claim came before
                # the reaping (its leases freed since) or after (they are this node's), it is
                # given back; what is still this node's is claimed again in the new epoch.
                self._give_round(token)
                await self._rt.db.write(_give_back, claim, self._rt.node)
                continue
            if not claim.recipients:
                self._give_round(token)
                if self._in_flight:
                    # A round is still out: its recipients, leased now, may come back due,
                    # so look again once it has ended rather than sleep or stop.
                    await self._settled.wait()
                    continue
                if self._slots:
                    # Kept by the sender for a round that never came (building it failed):
                    # nothing is in flight, so the sender is idle and they go back now.
                    await self._release_kept()
            else:
                self._in_flight += len(claim.recipients)
                self._preparing = True
                try:
                    prepared = await self._guarded(
                        claim, token, self._prepare(claim, token, epoch), False
                    )
                    if prepared is not None:
                        await send.send(prepared)
                        del prepared  # the sender owns it now (it holds the built messages)
                finally:
                    self._preparing = False
                continue
            if claim.slots_busy:
                wait_until = now + SLOTS_POLL
            else:
                wait_until = claim.next_due if claim.next_due is not None else now + IDLE_EXIT
            with trio.move_on_at(clock.deadline_for(wait_until)):
                await self._woken.wait()
            if claim.next_due is None and not claim.slots_busy and not self._woken.is_set():
                return

    async def _prepare(self, claim: throttle.Claimed, token: object, epoch: int) -> _Prepared:
        """Load the round's emails and build and sign their messages (in a worker thread)."""
        self._rounds += 1
        by_email: dict[str, list[Recipient]] = defaultdict(list)
        for recipient in claim.recipients:
            by_email[recipient.email_id].append(recipient)
        data = await self._rt.db.read(delivery.load_round, claim.recipients, LARGE)
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
        links = LinkSettings(self._rt.public_url, self._rt.secret_key, self._rt.smtp_host)
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
        outcome = _Round(self._rt.clock.now())
        for email_id, unreadable in data.unreadable.items():
            for recipient in by_email[email_id]:
                outcome.unreadable(recipient, unreadable.workspace_id, unreadable.error)
        work: list[_Transfer] = []
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
                    source = claim.sources.get(email.id)
                    work.append(_Transfer(email, mine, message, source))
        return _Prepared(claim, outcome, work, token, epoch)

    async def _take_large(
        self, data: delivery.RoundData, by_email: dict[str, list[Recipient]], token: object
    ) -> delivery.RoundData:
        """Keep one submitted message larger than LARGE in the round, read once the
        process's memory budget has room for it (held until the round ends, with its
        `token`); the recipients of the others go back, due at once, for the next rounds:
        eight 34 MiB messages are never read, built and signed at once."""
        kept = next(iter(data.large))
        put_back = [r for i in data.large if i != kept for r in by_email[i]]
        if put_back:
            await self._rt.db.write(emails.give_back, put_back, self._rt.node)
        memory = self._rt.message_memory
        cost = memory.cost(data.large[kept])
        await memory.acquire(cost)
        self._round_memory[token] = cost
        raw = await self._rt.db.read(emails.raw_of, kept)
        return replace(
            data,
            emails=[
                (replace(email, raw=raw) if email.id == kept else email, domain, late)
                for email, domain, late in data.emails
                if email.id == kept or email.id not in data.large
            ],
            large={},
        )

    # -- sending and recording ---------------------------------------------------------

    async def _sender(self, receive: trio.MemoryReceiveChannel[_Prepared]) -> None:
        async with receive:
            async for prepared in receive:
                # Keep the slots and connections for the next round if one is on its way.
                def next_round() -> bool:
                    return self._preparing or receive.statistics().tasks_waiting_send > 0

                work = self._deliver(prepared, next_round)
                written = prepared.outcome.written
                await self._guarded(prepared.claim, prepared.token, work, True, written)
                # Not kept while waiting for the next round: it holds the built messages.
                del prepared

    async def _deliver(self, prepared: _Prepared, next_round: Callable[[], bool]) -> None:
        claim, outcome, work = prepared.claim, prepared.outcome, prepared.work
        tenure = self._rt.tenure
        if self._lost is None and not await tenure.hold(prepared.epoch):
            await self._drop(prepared)
            return
        # The round may have waited for the one before it: its outcomes happen from now.
        outcome.now = self._rt.clock.now()
        self._slots += claim.slots
        if work and not self._slots:  # the round before gave its slots back meanwhile
            await self._wait_for_slots(claim.connections)
        if work and self._slots and not self._draining:
            connections = min(len(self._slots), claim.connections)
            await self._send(work, outcome, connections, claim.per_connection, prepared.epoch)
        # Keep the slots and connections for the next round if one is on its way; else
        # give them back with this round's outcomes.
        keep = next_round() and not self._draining
        released = [] if keep else self._slots
        async with outcome.writing:
            # The node stalled while it sent (kept outcomes are fenced when written).
            if self._lost is None and not await tenure.hold(prepared.epoch):
                await self._drop(prepared)
                return
            outcome.recount(await self._write_or_keep(outcome.take(), released))
        if not keep:
            self._slots = []
            await self._close_sessions()
        self._finish(prepared.claim, prepared.token)
        for kind, count in outcome.counts.items():
            self._counts[kind] += count

    async def _drop(self, prepared: _Prepared) -> None:
        """Give up a round claimed in an epoch that ended (engine/platform/tenure.py): the node was
        declared dead, what it held was freed and may be being delivered elsewhere, so
        nothing more of the round is sent or written. The slots went with the leases."""
        log.warning(
            "dropping a round of %d recipients at %s: this node was declared dead since"
            " it claimed them, and another node may be delivering them",
            len(prepared.claim.recipients),
            self.domain,
        )
        self._slots = []
        await self._close_sessions()
        self._finish(prepared.claim, prepared.token)

    def _commit_soon(self, outcome: _Round, epoch: int, writes: trio.Nursery) -> None:
        """Have the outcomes settled so far written, unless a write waiting already will."""
        if not outcome.write_queued:
            outcome.write_queued = True
            writes.start_soon(self._commit, outcome, epoch)

    async def _commit(self, outcome: _Round, epoch: int) -> None:
        """Write the outcomes settled so far. Transactions that end while one write is under
        way share the next: it writes everything settled until it takes the lock."""
        async with outcome.writing:
            outcome.write_queued = False
            if self._lost is None and not await self._rt.tenure.hold(epoch):
                outcome.done_with(outcome.settled)
                return  # the leases were freed: the outcomes are not this node's to write
            upto, part = outcome.settled, outcome.take()
            try:
                if part is not None:
                    outcome.recount(await self._write_or_keep(part, []))
            finally:
                outcome.done_with(upto)

    async def _write_or_keep(
        self, part: _Outcomes | None, released: list[int]
    ) -> list[tuple[str, str]]:
        """Write `part` and give back the `released` slots; the moves a mailbox full for days
        made. When the database fails the write, or failed one before, `part` goes to the
        router instead (`Kept`, no moves), written when the database answers, before this
        node delivers anything else; the slots are given back then, with every lease of its
        queues. Never raises an outage: the transactions under way on the other connections
        finish."""
        if self._lost is None:
            try:
                return await self._rt.db.write(_record, part, self._key, released, self._rt.node)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self._lose(exc)
        if part is not None:
            self._keep(Kept(self._key, part))
        return []

    async def _wait_for_slots(self, limit: int) -> None:
        """Take free connection slots, waiting for a release when all are taken elsewhere."""
        clock = self._rt.clock
        while not self._slots and not self._draining:
            self._woken = trio.Event()
            now = clock.now()
            self._slots = await self._rt.db.write(_acquire, self._key, limit, now, self._rt.node)
            if not self._slots:
                with trio.move_on_at(clock.deadline_for(now + SLOTS_POLL)):
                    await self._woken.wait()

    async def _guarded(
        self,
        claim: throttle.Claimed,
        token: object,
        work: Awaitable[T],
        sender: bool,
        written: set[tuple[str, str]] | None = None,
    ) -> T | None:
        """Run a round's step; if it raises, count a fault on each of its recipients (the
        items it held) whose outcome is not `written` yet, and try them again later; three
        faults quarantine a recipient (engine/platform/faults.py). The round's slots are given back,
        and when it was being sent, the connections and the slots the sender held with them."""
        try:
            return await work
        except Exception as exc:
            if not faults.blames_item(exc):
                raise
            rt = self._rt
            what = f"a round of {len(claim.recipients)} recipients at {self.domain}"
            error = rt.faults.item_fault("delivery", what, exc)
            slots = list(claim.slots)
            if sender:
                slots, self._slots = [*self._slots, *slots], []
                await self._close_sessions()
            done = written or set()
            quarantined = await rt.db.write(
                _record_faults,
                [r for r in claim.recipients if (r.email_id, r.address) not in done],
                list(dict.fromkeys(slots)),
                error,
                self._key,
                rt.node,
                rt.clock.now(),
            )
            rt.faults.quarantined("delivery", quarantined)
            self._finish(claim, token)
            return None

    def _finish(self, claim: throttle.Claimed, token: object) -> None:
        self._in_flight -= len(claim.recipients)
        self._give_round(token)
        self._settled.set()

    async def _take_round(self) -> object:
        """One of the router's rounds in flight, held by the token returned."""
        token = object()
        await self._rounds_in_flight.acquire_on_behalf_of(token)
        self._round_tokens.add(token)
        return token

    def _give_round(self, token: object) -> None:
        self._rt.message_memory.release(self._round_memory.pop(token, 0))
        self._round_tokens.discard(token)
        self._rounds_in_flight.release_on_behalf_of(token)

    async def _send(
        self,
        work: list[_Transfer],
        outcome: _Round,
        connections: int,
        per_connection: int | None,
        epoch: int,
    ) -> None:
        """Hand the transfers to `connections` parallel sessions with the domain's MX, each
        carrying at most `per_connection` of them (None: no limit). Draining, the transfers
        no connection started are left as they are: not an attempt."""
        rt = self._rt
        # Sandboxed workspaces' transfers never reach the network (engine/sandbox/capture.py):
        # the sandbox settles their recipients through `outcome`, before DNS and SMTP.
        work = await sandbox_capture.divert(rt, work, outcome)
        if not work:
            return
        failure: Outcome
        try:
            targets = await mx.targets(
                rt.resolver, self.domain, allow_private=rt.allow_private_targets
            )
        except mx.NoMailService as exc:
            failure = NoMailService(str(exc))
        except lookups.TemporaryDnsError as exc:
            failure = DnsFailure(str(exc))
        except mx.PrivateTargets as exc:
            failure = PrivateTargets(str(exc))
        else:
            try:
                policy = await self._policies.current()
            except Exception as exc:
                # What is sent could not be recorded: the queue drains, sending nothing.
                if not is_outage(exc):
                    raise
                self._lose(exc)
                return
            covered = await dane.lookup(rt, targets)  # nothing asked with POSTROOM_DNSSEC off
            if policy != self._policy or covered != self._dane:
                await self._close_sessions()  # kept ones were opened under another policy
            self._policy, self._dane = policy, covered
            applied = "opportunistic" if policy is None else "mta-sts"
            # Each egress source has connections of its own, never shared with another's mail.
            queues: dict[str | None, deque[_Transfer]] = defaultdict(deque)
            for transfer in work:
                queues[None if transfer.source is None else transfer.source.id].append(transfer)
            problems: list[Outcome] = []
            async with trio.open_nursery() as nursery:
                for queue, count in zip(
                    queues.values(), _shares(connections, queues.values()), strict=True
                ):
                    for _ in range(count):
                        nursery.start_soon(
                            self._connection,
                            targets,
                            queue,
                            outcome,
                            problems,
                            per_connection,
                            epoch,
                            nursery,
                            queue[0].source,
                        )
            work = [t for queue in queues.values() for t in queue]  # what none could take
            failure = _worst(problems)
            if isinstance(failure, Unreachable) and failure.policy is None:
                failure = replace(failure, policy=applied)
            if self._draining:
                return
        for transfer in work:
            for recipient in transfer.recipients:
                outcome.settle(transfer.email, recipient, failure)

    async def _connection(
        self,
        targets: list[mx.MxTarget],
        queue: deque[_Transfer],
        outcome: _Round,
        problems: list[Outcome],
        per_connection: int | None,
        epoch: int,
        writes: trio.Nursery,
        source: Source | None,
    ) -> None:
        """One SMTP connection from `source`, reused for transfer after transfer until the
        queue is empty (a new one after every `per_connection` transfers); one the round
        before kept from the same source if there is one, else a new one. Before each
        transfer it makes sure the node still holds the round's leases and is not draining,
        and after it has its outcome written (in `writes`, while it goes on)."""
        kept = [s for s in self._sessions if s.source == _bound(source, self._rt)]
        reused = bool(kept)
        if reused:
            self._sessions.remove(kept[-1])
        session = kept[-1] if reused else await self._open(targets, source)
        if not isinstance(session, SmtpSession):
            problems.append(session)
            return
        sent = self._uses.pop(id(session), 0)
        mine = 0  # outcomes settled up to this connection's last transaction
        try:
            while queue:
                if not await self._may_start(epoch):
                    return  # the rest is left: for after the stop or outage, or another node
                if per_connection is not None and sent >= per_connection:
                    await self._quit(session)
                    reused, sent = False, 0
                    session = await self._open(targets, source)
                    if not isinstance(session, SmtpSession):
                        problems.append(session)
                        return
                transfer = queue.popleft()
                addresses = [r.address for r in transfer.recipients]
                # The message goes only once this connection's last outcome is written.
                written = partial(outcome.recorded, mine)
                try:
                    message = transfer.message
                    data = message.for_hop("SMTPUTF8" in session.extensions)
                    result = await session.send(
                        message.envelope_from,
                        addresses,
                        data,
                        before_message=written,
                        requiretls=transfer.email.requiretls,  # RFC 8689: verified TLS only
                    )
                except SmtpError as exc:
                    if reused:
                        # A kept connection the server dropped while it waited: the
                        # transfer goes on a new one.
                        queue.appendleft(transfer)
                        await self._quit(session)
                        reused, sent = False, 0
                        session = await self._open(targets, source)
                        if not isinstance(session, SmtpSession):
                            problems.append(session)
                            return
                        continue
                    # The connection broke: this transfer waits for the next attempt; the
                    # other connections go on with the rest. A 421 that closed it is kept, for
                    # classify to read (a rate limit is a destination incident).
                    reply = getattr(exc, "reply", None)
                    broke = Unreachable(str(exc), reply, policy=session.peer.policy)
                    for recipient in transfer.recipients:
                        outcome.settle(transfer.email, recipient, broke)
                    return
                reused = False
                sent += 1
                outcome.now = self._rt.clock.now()
                for recipient in transfer.recipients:
                    reply = result.outcome_for(recipient.address)
                    replied = Replied(reply, reply is result.mail_reply, session.peer)
                    verdict = outcome.settle(transfer.email, recipient, replied)
                    if verdict is Verdict.DELIVERED:
                        waited = outcome.now - recipient.queued_at
                        self._latency.observe(waited.total_seconds())
                        peer = session.peer
                        tls = tls_counts.outcome(peer.tls_version, peer.tls_verified)
                        self._rt.tls_deliveries.note(peer.policy, tls)
                self._commit_soon(outcome, epoch, writes)
                mine = outcome.settled  # the write just asked for takes them all
        finally:
            if isinstance(session, SmtpSession):
                if session.usable:
                    self._sessions.append(session)
                    self._uses[id(session)] = sent
                else:
                    await self._quit(session)

    async def _may_start(self, epoch: int) -> bool:
        """Whether a connection may start another SMTP transaction (send MAIL FROM): the
        queue is not draining, the database is not known gone (then the queue drains as on a
        failed write: what it sends could not be recorded) and the node still holds the
        round's leases (engine/platform/tenure.py; asked again after waiting for a heartbeat)."""
        if not self._can_record():
            return False
        return await self._rt.tenure.hold(epoch) and self._can_record()

    def _can_record(self) -> bool:
        """Whether the queue may go on sending: not draining, and (noted now) not lost."""
        down_for = self._rt.db.unreachable_for()
        if down_for is not None:
            self._lose(DatabaseUnreachable(down_for))
        return not self._draining

    async def _open(
        self, targets: list[mx.MxTarget], source: Source | None
    ) -> SmtpSession | Outcome:
        """A session from `source` with the first MX host that answers, or why none did.

        Without an MTA-STS policy, a failed TLS handshake is tried once more with the same
        host in plain text (opportunistic TLS, as Postfix's `may` level). Under a policy, a
        host it lists is asked for TLS with its certificate verified for the MX name; in
        `enforce` mode a host it does not list, a failed or refused STARTTLS or an invalid
        certificate passes over the host (`tls_policy`), and in `testing` mode the delivery
        goes on as opportunistic TLS would. A host DANE covers is spoken to only as
        `_open_under_dane` says, whatever the MTA-STS policy. A host refusing the session for
        good is passed over for the next one.
        """
        problems: list[Outcome] = []
        rt, policy = self._rt, self._policy
        local_address, helo_name = _bound(source, rt)
        enforced = policy is not None and policy.enforced
        applied = "opportunistic" if policy is None else "mta-sts"
        # For hosts a policy lists; loaded only then (the CA store costs ~45 ms of CPU).
        verifying = None if policy is None else outbound_http.tls_context(rt.extra_ca_file)
        for target in targets:
            covered = self._dane.get(target.host)
            if covered is not None:
                opened = await self._open_under_dane(target, covered, source)
                if isinstance(opened, SmtpSession):
                    return opened
                problems += opened
                continue
            listed = policy is not None and policy.allows(target.host)
            if enforced and not listed:
                unlisted = f"{target.host} is not listed by the MTA-STS policy of {self.domain}"
                problems.append(_refused_by_policy(unlisted, "mta-sts"))
                continue
            for address in target.addresses:
                where = f"{target.host} [{address}]"
                tls: ssl.SSLContext | None = verifying if listed else self._tls
                while True:
                    try:
                        session = await connect(
                            address,
                            rt.delivery_port,
                            helo_name=helo_name,
                            tls=tls,
                            local_address=local_address,
                            mx_host=target.host,
                            policy=applied,
                        )
                    except TlsFailure as exc:
                        if enforced:
                            problems.append(_refused_by_policy(f"{where}: {exc}", "mta-sts"))
                            break
                        if tls is None:
                            problems.append(Unreachable(f"{where}: {exc}", exc.reply))
                            break
                        if tls is verifying:  # testing mode: noted, and delivered anyway
                            log.info("MTA-STS (testing) check failed with %s: %s", where, exc)
                            tls = self._tls
                            continue
                        log.info("TLS failed with %s, trying again in plain text: %s", where, exc)
                        tls = None
                        continue
                    except PermanentFailure as exc:
                        problems.append(SessionRefused(f"{where}: {exc}", exc.reply))
                        break
                    except SmtpError as exc:
                        problems.append(Unreachable(f"{where}: {exc}", getattr(exc, "reply", None)))
                        break
                    if enforced and not session.tls_active:
                        await self._quit(session)
                        problems.append(_refused_by_policy(f"{where} did not start TLS", "mta-sts"))
                        break
                    return session
        return _worst(problems)

    async def _open_under_dane(
        self, target: mx.MxTarget, covered: tuple[dane.Tlsa, ...] | str, source: Source | None
    ) -> SmtpSession | list[Outcome]:
        """A session with a host DANE covers, over TLS whose certificates its TLSA records
        accept (`covered`; a string: why the host is passed over), or why there is none. No
        TLS, no match or a failed lookup pass the host over (`tls_policy`), never plain text
        (RFC 7672 2.2)."""
        if isinstance(covered, str):
            return [_refused_by_policy(covered, "dane")]
        rt = self._rt
        local_address, helo_name = _bound(source, rt)
        problems: list[Outcome] = []

        def check(chain: list[bytes]) -> str | None:
            return dane.check(covered, chain, target.host, rt.clock.now())

        for address in target.addresses:
            where = f"{target.host} [{address}]"
            try:
                # The queue's context verifies nothing itself: `check` does, after the handshake.
                session = await connect(
                    address,
                    rt.delivery_port,
                    helo_name=helo_name,
                    tls=self._tls,
                    local_address=local_address,
                    mx_host=target.host,
                    policy="dane",
                    check=check,
                )
            except TlsFailure as exc:
                problems.append(_refused_by_policy(f"{where}: {exc}", "dane"))
                continue
            except PermanentFailure as exc:
                problems.append(SessionRefused(f"{where}: {exc}", exc.reply))
                continue
            except SmtpError as exc:
                problems.append(Unreachable(f"{where}: {exc}", getattr(exc, "reply", None)))
                continue
            if not session.tls_active:
                await self._quit(session)
                problems.append(_refused_by_policy(f"{where} did not start TLS", "dane"))
                continue
            return session
        return problems

    async def _quit(self, session: SmtpSession) -> None:
        """End a session with QUIT (then close), waiting at most QUIT_WAIT for the server."""
        with trio.move_on_after(QUIT_WAIT):
            await session.quit()
        await session.aclose()

    async def _release_kept(self) -> None:
        slots, self._slots = self._slots, []
        await self._close_sessions()
        await self._rt.db.write(_release, self._key, slots, self._rt.node)

    async def _close_sessions(self) -> None:
        sessions, self._sessions = self._sessions, []
        self._uses.clear()
        for session in sessions:
            await self._quit(session)

    @property
    def _key(self) -> str:
        """The key its connection slots are counted under."""
        return self._slot_key or self.domain

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


def _bound(source: Source | None, rt: Runtime) -> tuple[str | None, str]:
    """The bind address and EHLO name of a connection from `source` (None: the default
    egress, from the host's address with the configured SMTP host name)."""
    if source is None:
        return None, rt.smtp_host
    return source.bind_address, source.ehlo_name


def _shares(connections: int, queues: Iterable[Sized]) -> list[int]:
    """The connections each source's queue opens: the round's `connections` dealt out in
    turn, each at least one, none more than it has transfers."""
    sizes = [len(q) for q in queues]
    counts = [1] * len(sizes)
    spare = connections - len(sizes)
    while spare > 0 and any(c < n for c, n in zip(counts, sizes, strict=True)):
        for i, n in enumerate(sizes):
            if spare > 0 and counts[i] < n:
                counts[i] += 1
                spare -= 1
    return counts


def _refused_by_policy(detail: str, policy: str) -> Unreachable:
    """A host passed over because the TLS `policy` (mta-sts, dane) forbids the session."""
    return Unreachable(f"tls_policy: {detail}", policy=policy, tls_policy=True)


def _worst(problems: list[Outcome]) -> Outcome:
    """What the recipients of transfers no connection could take are told: a refusal only
    when every host refused us for good, else the reasons none could be reached (and whether
    the TLS policy passed over any of them, and which: the first that did)."""
    if problems and all(isinstance(p, SessionRefused) for p in problems):
        return problems[0]
    reasons = [p.detail for p in problems if isinstance(p, Unreachable | SessionRefused)]
    passed_over = [p for p in problems if isinstance(p, Unreachable) and p.tls_policy]
    detail = "; ".join(dict.fromkeys(reasons)) or "no MX host to try"
    policy = passed_over[0].policy if passed_over else None
    return Unreachable(detail, policy=policy, tls_policy=bool(passed_over))
