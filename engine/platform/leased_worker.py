"""The loop of every actor that works leased rows (webhook deliveries, forward jobs).

Claim due rows with a lease (up to the room left under the actor's in-flight limit) → work
each in a task of its own, which records its own outcome → when nothing was due, sleep until
the next row falls due, a wake-up arrives (engine/platform/wakeups.py), or the safety-net poll passes.
The database holds all the work, so a restart, or another node, claims again whatever was not
finished.

Each item is worked inside a guard (engine/platform/faults.py): an exception from one item is that
item's fault — logged, counted, the item tried again later and quarantined after three — and
never stops the actor or the items beside it. Only a database outage leaves the actor, for
the supervisor to wait out.

A clean stop drains it (`drain`): it claims nothing more, and the items under way (a webhook
POST, a forward's SMTP transaction) finish and record their outcomes instead of being cut and
worked again, twice, after the restart. What it claimed and had not started keeps its lease
until the node gives back all it holds.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Generic, Protocol, TypeVar

import trio

from engine.platform import faults
from engine.platform.runtime import Runtime
from engine.platform.wakeups import Wakeups
from storage import nodes
from storage.leases import Claimed, Fault, LeasedTable

T = TypeVar("T")


class LeasedWork(Protocol[T]):
    """What an actor plugs into the loop."""

    name: str
    table: LeasedTable

    def key(self, item: T) -> str:
        """The item's row id."""
        ...

    async def claim(self, now: datetime, limit: int) -> Claimed[T]:
        """Lease up to `limit` due items (rows that cannot be read count faults instead)."""
        ...

    async def work(self, item: T) -> None:
        """Work one item and record its outcome."""
        ...


class LeasedWorker(Generic[T]):
    def __init__(
        self,
        rt: Runtime,
        work: LeasedWork[T],
        *,
        in_flight: int,
        batch: int,
        poll: timedelta,
        wakeups: Wakeups | None = None,
    ) -> None:
        self._rt = rt
        self._work = work
        self._limit = in_flight
        self._batch = batch
        self._poll = poll
        self._wakeups = wakeups
        self._in_flight = trio.CapacityLimiter(in_flight)
        # An item whose work outlives its lease is claimed again; the running task records it.
        self._working: set[str] = set()
        self._draining = False
        self._claiming: trio.CancelScope | None = None  # the running claim loop's
        self._running = False
        self._drained = trio.Event()  # draining, and no item is under way any more

    @property
    def in_flight(self) -> int:
        return self._limit - int(self._in_flight.available_tokens)

    async def run(self, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Claim and work until cancelled or drained (the actor's `run` calls this once started)."""
        rt = self._rt
        # Started again after a fault: the rows this node held died with their tasks, and its
        # heartbeat would renew those leases for as long as it lives.
        await rt.db.write(nodes.release, rt.node, (self._work.table.name,))
        self._running = True
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                with trio.CancelScope() as self._claiming:
                    if not self._draining:
                        await self._claim_and_work(nursery)
        finally:
            self._running = False
            if self._draining:
                self._drained.set()

    async def drain(self) -> None:
        """Claim nothing more; return once the items under way have finished and recorded
        their outcomes (`run` returns with them). (The caller bounds the wait.)"""
        self._draining = True
        if self._claiming is not None:
            self._claiming.cancel()
        if self._running:
            await self._drained.wait()

    async def _claim_and_work(self, nursery: trio.Nursery) -> None:
        rt = self._rt
        while True:
            now = rt.clock.now()
            room = min(self._batch, int(self._in_flight.available_tokens))
            if room == 0:
                await self._sleep_until(now + self._poll)
                continue
            claim = await self._work.claim(now, room)
            for fault in claim.faults:
                rt.faults.unreadable(self._work.name, fault)
            rt.faults.quarantined(self._work.name, claim.quarantined)
            for item in claim.items:
                key = self._work.key(item)
                if key in self._working:
                    continue
                self._working.add(key)
                await self._in_flight.acquire_on_behalf_of(key)
                nursery.start_soon(self._guarded, item, key)
            if claim.items:
                continue
            next_due = claim.next_due
            wake = now + self._poll if next_due is None else min(next_due, now + self._poll)
            await self._sleep_until(wake)

    async def _sleep_until(self, until: datetime) -> None:
        """Sleep until `until`, or until woken, whichever is first."""
        deadline = self._rt.clock.deadline_for(until)
        if self._wakeups is None:
            await trio.sleep_until(deadline)
            return
        with trio.move_on_at(deadline):
            await self._wakeups.receive.receive()
        while True:  # one pass over the database serves every wake-up already sent
            try:
                self._wakeups.receive.receive_nowait()
            except trio.WouldBlock:
                return

    async def _guarded(self, item: T, key: str) -> None:
        rt = self._rt
        try:
            await self._work.work(item)
        except Exception as exc:
            if not faults.blames_item(exc):
                raise
            error = rt.faults.item_fault(self._work.name, f"item {key}", exc)
            now = rt.clock.now()
            quarantined = await rt.db.write(
                self._work.table.record_faults,
                [Fault(key, error)],
                now,
                faults.policy(now),
                rt.node,  # not if the node was declared dead meanwhile: another's row now
            )
            rt.faults.quarantined(self._work.name, quarantined)
        finally:
            self._working.discard(key)
            self._in_flight.release_on_behalf_of(key)
