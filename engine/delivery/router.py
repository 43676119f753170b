"""The delivery router: one `DomainQueue` actor per recipient domain with work, each with
its own SMTP egress, the site pool those egresses leave idle connections in for one another
(engine/delivery/site_pool.py: per egress source and MX host), and the routes that choose
another egress for some transfers (the sandbox's, for sandboxed workspaces:
engine/delivery/egress.py).

On start it wakes a queue for every domain with recipients still to try, so nothing accepted
before a crash is left behind. Afterwards it wakes (or starts) a domain's queue whenever a
`mail:<domain>` wake-up arrives from this node or another (engine/platform/wakeups.py), and looks at
every domain again on a rescan (a dead node's work was freed). A queue that ran out of work
has returned and is started afresh. At most `ROUNDS_IN_FLIGHT` queues deliver at once.

A clean stop drains it (`drain`): no queue claims or starts a transaction any more, those
under way finish and their outcomes are written, so a restart sends nothing twice.

A database outage drains it the same way, from the first queue whose write fails or that
finds the database gone, except that the outcomes nothing could write are kept: the queues
hand them to the router (`Kept`), which alone holds and writes them. Once every queue has
ended it raises the outage; the supervisor starts it again when the database answers, and it
first writes what it kept (fenced: storage/delivery.py, `statuses.UNHELD`), then gives back
its node's leases and looks for work. So what a node delivered is not sent again because the
database was gone when it was, and nothing is delivered before those outcomes are written. A
clean stop writes them too if the database takes them; if it does not, they are saved to the
node's spool (engine/delivery/kept_journal.py, POSTROOM_SPOOL_DIR), and the next router to
start on that disk writes them first, under the leases of the node that kept them. They are
saved as soon as a write of them fails (the router's run ending with the outage, or a drain),
so a process killed afterwards loses nothing; one killed while its last transactions are
still under way loses what those return, and those recipients are sent again.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import trio

from engine.delivery.domain_queue import DomainQueue, DomainQueueStatistics, Kept, write_kept
from engine.delivery.egress import Routes, Selective, Source
from engine.delivery.kept_journal import Adopted, Journal
from engine.delivery.latency import LatencyHistogram, LatencySnapshot
from engine.delivery.site_pool import SitePool
from engine.delivery.smtp_egress import SourcedEgress, opportunistic_tls
from engine.platform.runtime import Runtime
from engine.platform.wakeups import RESCAN
from storage import emails, nodes
from storage.errors import is_outage

log = logging.getLogger("postroom.delivery")

# Delivery rounds (claim, build and sign up to a batch, send, record) in flight across every
# domain, as Postfix caps its smtp processes (default_process_limit 100): a backlog spread
# over thousands of domains is worked through a bounded number at a time instead of building
# every domain's batch at once, which held 800 MiB and starved the API for 18 s at start-up.
ROUNDS_IN_FLIGHT = 64
OWN_LEASES = ("email_recipients", "destination_slots")  # what the router's queues hold


@dataclass(frozen=True, slots=True)
class RouterStatistics:
    active_queues: int
    delivered: int
    deferred: int
    bounced: int
    failed: int
    # The queues running now, each with its own counts and what it has in flight.
    domains: tuple[DomainQueueStatistics, ...] = ()
    # Accept -> 250, every delivered recipient since start.
    delivery_latency: LatencySnapshot | None = None
    # Delivered recipients by TLS policy and outcome: (policy, outcome, count).
    tls: tuple[tuple[str, str, int], ...] = ()


class DeliveryRouter:
    name = "delivery"

    def __init__(self, rt: Runtime, selective: Sequence[Selective] = ()) -> None:
        """`selective`: the egresses that take some transfers before the SMTP egress does
        (the sandbox's, given by postroom/service.py)."""
        self._rt = rt
        self._routes = Routes(selective)
        self._queues: dict[str, DomainQueue] = {}
        self._finished = RouterStatistics(0, 0, 0, 0, 0)  # totals of queues that returned
        self._tls = opportunistic_tls()
        self._sites = SitePool()  # outlives a run: a restart after an outage finds them
        self._latency = LatencyHistogram()
        self._rounds = trio.CapacityLimiter(ROUNDS_IN_FLIGHT)
        self._draining = False
        self._drained = trio.Event()  # draining, and every queue has returned
        # Outcomes the queues could not write (an outage), handed over on this channel and
        # taken into `_kept` only under `_writing_kept` (one holder at a time: a restarted
        # `run`, its end by an outage, or a drain); they outlive a run, so a restart writes
        # them. What is kept is saved to the spool as soon as a write of it fails
        # (`_unsaved` until then), and the spool files holding the rest (saved by this
        # process, or adopted from one that ended) stay held in `_files` until written.
        self._keep, self._kept_receive = trio.open_memory_channel[Kept](math.inf)
        self._kept: list[Kept] = []
        self._unsaved: list[Kept] = []
        self._files: list[Adopted] = []
        self._writing_kept = trio.Lock()
        self._journal = None if rt.spool_dir is None else Journal(rt.spool_dir)
        self._lost: BaseException | None = None  # the outage that is draining the queues

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        db = self._rt.db
        self._lost = None
        await self._write_kept(adopt=True)
        # Started again after a fault: the recipients and connection slots this node held died
        # with their queues, and its heartbeat would renew those leases for as long as it lives.
        await db.write(nodes.release, self._rt.node, OWN_LEASES)
        try:
            await self._route(task_status=task_status)
        except Exception as exc:
            if is_outage(exc):  # every queue has ended: what they kept goes to the spool
                async with self._writing_kept:
                    self._take_handed()
                    await self._save_unsaved()
            raise
        finally:
            await self._sites.abandon()

    async def _route(self, task_status: trio.TaskStatus[None]) -> None:
        db = self._rt.db
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._sites.run)
            for domain in await db.read(emails.domains_with_work):
                self._wake(nursery, domain)
            task_status.started()
            wakeups = self._rt.wakeups.mail
            async for domain in wakeups.receive:
                if wakeups.overflowed:
                    wakeups.overflowed = False
                    try:
                        pending = await db.read(emails.domains_with_work)
                    except Exception as exc:
                        if not is_outage(exc):
                            raise
                        self._lose(exc)
                        pending = []
                    for each in pending:
                        self._wake(nursery, each)
                if domain != RESCAN:
                    self._wake(nursery, domain)

    async def _write_kept(self, *, adopt: bool = False) -> None:
        """Write the outcomes kept through an outage, before anything else: before this node
        gives back its leases (they are still its own unless it was declared dead) and long
        before it claims anything; with `adopt`, first those in spool files that no other
        process holds (saved by one that ended). Raises while the database cannot take them:
        kept still, and saved."""
        async with self._writing_kept:
            if adopt and self._journal is not None:
                for adopted in await trio.to_thread.run_sync(self._journal.adopt):
                    self._files.append(adopted)
                    self._kept.extend(adopted.kept)
            self._take_handed()
            if not self._kept:
                return
            recipients = sum(len(each.part.updates) for each in self._kept)
            try:
                await self._rt.db.write(write_kept, self._kept, self._rt.clock.now())
            except Exception as exc:
                if is_outage(exc):
                    await self._save_unsaved()
                    raise
                # Never let what was kept hold delivery back for good.
                log.exception(
                    "could not write the outcomes of %d recipients kept through an outage;"
                    " they will be delivered again",
                    recipients,
                )
                if self._journal is not None:
                    await trio.to_thread.run_sync(self._journal.refused, self._files)
            else:
                log.warning(
                    "wrote the outcomes of %d recipients kept through an outage", recipients
                )
                if self._journal is not None:
                    await trio.to_thread.run_sync(self._journal.done, self._files)
            self._kept, self._unsaved, self._files = [], [], []

    def _take_handed(self) -> None:
        """Take what the queues handed over (under `_writing_kept`)."""
        while True:
            try:
                kept = self._kept_receive.receive_nowait()
            except trio.WouldBlock:
                return
            self._kept.append(kept)
            self._unsaved.append(kept)

    async def _save_unsaved(self) -> None:
        """Save to the spool what is kept and not saved yet (under `_writing_kept`)."""
        if self._journal is None or not self._unsaved:
            return
        recipients = sum(len(each.part.updates) for each in self._unsaved)
        try:
            saved = await trio.to_thread.run_sync(self._journal.save, self._unsaved)
        except (OSError, TypeError, ValueError) as exc:
            log.error(
                "could not save the outcomes of %d recipients the database did not take in"
                " %s (%s): they are kept in memory only",
                recipients,
                self._journal.directory,
                exc,
            )
            return
        self._files.append(saved)
        self._unsaved = []
        log.warning(
            "saved the outcomes of %d recipients the database did not take in %s: written"
            " when it answers, or by the next node started on this disk",
            recipients,
            saved.path,
        )

    def _lose(self, exc: BaseException) -> None:
        """The database is gone: every queue drains as for a stop (the transactions under way
        finish, their outcomes kept), no queue starts, and `run` raises `exc` once all ended
        (the last queue to end raises it, so that none is cut short)."""
        if self._lost is None:
            self._lost = exc
            for queue in self._queues.values():
                queue.drain()
        if not self._queues:
            raise exc

    async def drain(self) -> None:
        """Stop delivering, as a clean stop does: every queue stops claiming and starting
        transactions; returns once the transactions under way have ended, their outcomes are
        written and their connections closed with QUIT. (The caller bounds the wait.)"""
        self._draining = True
        for queue in self._queues.values():
            queue.drain()
        if not self._queues:
            self._drained.set()
        await self._drained.wait()
        await self._sites.close()
        # Stopping during or just after an outage: what is kept is written if the database
        # takes it now; else it is in the spool, for the next node started on this disk.
        try:
            await self._write_kept()
        except Exception as exc:
            if not is_outage(exc):
                raise
            unsaved = sum(len(each.part.updates) for each in self._unsaved)
            if unsaved:
                log.error(
                    "stopping with the outcomes of %d recipients the database did not take"
                    " and that could not be saved: they will be delivered again",
                    unsaved,
                )
            else:
                assert self._journal is not None  # without one, all that is kept is unsaved
                log.warning(
                    "stopping with the outcomes of %d recipients the database did not take,"
                    " saved in %s",
                    sum(len(each.part.updates) for each in self._kept),
                    self._journal.directory,
                )

    def _wake(self, nursery: trio.Nursery, domain: str) -> None:
        if self._draining or self._lost is not None:
            return
        queue = self._queues.get(domain)
        if queue is None:
            keep = self._keep.send_nowait
            # Mail of no egress source greets as the service's host, from the address the
            # system picks; each source's connections are its own (engine/delivery/egress.py).
            default = Source(self._rt.smtp_host)
            egress = SourcedEgress(self._rt, domain, self._tls, default, self._sites)
            queue = DomainQueue(
                self._rt, domain, egress, self._routes, self._rounds, keep, self._latency
            )
            self._queues[domain] = queue
            nursery.start_soon(self._run_queue, queue)
        queue.wake()

    async def _run_queue(self, queue: DomainQueue) -> None:
        lost: BaseException | None = None
        try:
            await queue.run()
        except Exception as exc:
            if not is_outage(exc):
                raise
            lost = exc
        finally:
            del self._queues[queue.domain]
            if self._draining and not self._queues:
                self._drained.set()
            done, f = queue.statistics(), self._finished
            self._finished = RouterStatistics(
                0,
                f.delivered + done.delivered,
                f.deferred + done.deferred,
                f.bounced + done.bounced,
                f.failed + done.failed,
            )
        lost = self._lost or lost
        if lost is not None:
            self._lose(lost)  # raises it if this was the last queue

    def statistics(self) -> RouterStatistics:
        queues = tuple(q.statistics() for q in self._queues.values())
        every: list[DomainQueueStatistics | RouterStatistics] = [self._finished, *queues]
        return RouterStatistics(
            active_queues=len(self._queues),
            delivered=sum(s.delivered for s in every),
            deferred=sum(s.deferred for s in every),
            bounced=sum(s.bounced for s in every),
            failed=sum(s.failed for s in every),
            domains=queues,
            delivery_latency=self._latency.snapshot(),
            tls=self._rt.tls_deliveries.snapshot(),
        )
