"""This process as one node of a cluster sharing the database.

Each process is a node with an id of its own (random, with host and pid for people), never the
host name: several processes share a host. The node registers at start and beats every
`HEARTBEAT`; each beat renews every lease it holds (work rows, connection slots, leaderships,
idempotency claims), so leases stay short (`LEASE`) however long the work takes. A node that
has not beaten for `DEAD_AFTER` is dead: the first live node to notice frees everything it
held and wakes every node to look again, so its accepted mail is taken over in seconds
instead of when a long lease lapses. A clean stop gives back only the node's own leases.

A database outage is not a node death: every node is silent through it. So a node judges
others only once it has itself reached the database without a break for `DEAD_AFTER` (its
beats went through, none failed, none came late), and then only those silent for `DEAD_AFTER`
within that time: a node is declared dead only after the database was reachable long enough
for it to miss its beats. A node just started, or back from an outage or a pause of its own
(a clock jump in tests), waits that long before it judges. One that finds it was declared
dead re-registers and carries on; what it held was freed and may be worked elsewhere.

Its tenure (engine/platform/tenure.py) makes sure a node that was declared dead sends none of what it
held: each beat tells the tenure for how long the leases may be trusted (`TRUST`, less than
`DEAD_AFTER`), and a beat that finds the node dead ends the epoch whose claims it drops. A task
that finds the trust run out asks for a beat at once.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

import trio

from engine.platform.runtime import Runtime
from engine.platform.tenure import MARGIN
from engine.platform.wakeups import RESCAN
from storage import idempotency, leaderships, nodes
from storage.errors import is_outage

HEARTBEAT = timedelta(seconds=3)
DEAD_AFTER = timedelta(seconds=15)
# How long after the start of a beat its node trusts that it holds its leases: less than
# DEAD_AFTER by a margin, so the trust ends before another node may free them.
TRUST = DEAD_AFTER.total_seconds() - MARGIN
LEASE = timedelta(seconds=30)  # every lease a node takes, renewed at each of its beats
FORGET_AFTER = timedelta(days=7)  # ended nodes stay listed this long

# What a node runs (postroom/workers.py splits `serve --workers N` between the last two):
# everything; the API and the SMTP doors only; or delivery and the other actors only.
Role = Literal["all", "intake", "delivery"]

log = logging.getLogger("postroom.nodes")


def new_node_id() -> str:
    """A node id unique to this process: host and pid for people, random bits for certainty."""
    return f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"


async def register(rt: Runtime, role: Role = "all", instance: str | None = None) -> None:
    """Join the cluster in `role`, one of the workers of `instance` (postroom/workers.py)."""
    host, pid = socket.gethostname(), os.getpid()
    started = trio.current_time()
    await rt.db.write(nodes.register, rt.node, host, pid, role, instance, rt.clock.now())
    rt.tenure.beaten(started, True, TRUST)  # registering is the first beat


async def stop(rt: Runtime) -> int:
    """Leave the cluster cleanly: give back what this node holds; how many leases."""
    return await rt.db.write(nodes.stop, rt.node, rt.clock.now())


async def lead(rt: Runtime, name: str) -> bool:
    """Whether this node holds (now takes, or keeps) the leadership `name`."""
    now = rt.clock.now()
    return await rt.db.write(leaderships.hold, name, rt.node, now, now + LEASE)


@dataclass(frozen=True, slots=True)
class NodeStatistics:
    beats: int
    reaped: int


class NodeKeeper:
    """The actor that beats for this node and reaps the dead ones. Each beat publishes what
    `metrics` says (the process's figures, postroom/metrics.py), when set."""

    name = "node"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self.metrics: Callable[[], str] | None = None
        self._beats = 0
        self._reaped = 0
        self._last_beat: datetime | None = None
        # Since when this node has reached the database without a break; None: it has not
        # since its start or its last failed beat. Kept across the supervisor's restarts.
        self._reachable_since: datetime | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        clock = self._rt.clock
        while True:
            # Every HEARTBEAT, or at once when a task no longer trusts the last beat.
            with trio.move_on_at(clock.deadline_for(clock.now() + HEARTBEAT)):
                await self._rt.tenure.wanted()
            await self.beat()

    async def beat(self) -> None:
        rt = self._rt
        started = trio.current_time()
        now = rt.clock.now()
        published = self._published()
        unsettled = rt.unsettled_claims.take()
        try:
            if unsettled:  # requests that ended in an outage: their keys can be used again
                await rt.db.write(idempotency.settle, unsettled, rt.node)
            alive = await rt.db.write(nodes.beat, rt.node, now, now + LEASE, published)
            rt.tenure.beaten(started, alive, TRUST)
        except Exception as exc:
            if is_outage(exc):
                self._reachable_since = None
                for claim, stored in unsettled.items():  # not settled yet: at the next beat
                    rt.unsettled_claims.claims.setdefault(claim, stored)
            raise
        if not alive:
            log.error(
                "this node was declared dead by another (no heartbeat for %s s):"
                " what it held was freed, and what it had claimed is dropped unsent;"
                " registering again",
                DEAD_AFTER.total_seconds(),
            )
            await rt.db.write(nodes.revive, rt.node, now)
        late = self._last_beat is not None and now - self._last_beat > DEAD_AFTER
        if self._reachable_since is None or late:
            self._reachable_since = now
        self._last_beat = now
        self._beats += 1
        if now - self._reachable_since < DEAD_AFTER:
            return  # not watched long enough to tell a dead node from a database outage
        reaped = await rt.db.write(nodes.reap, now - DEAD_AFTER, now)
        if reaped:
            self._reaped += len(reaped)
            log.warning("took over the work of %d dead nodes: %s", len(reaped), ", ".join(reaped))
            # Every actor looks again; broadcast recovery fails what the dead left `sending`.
            rt.wakeups.announce([RESCAN])
        if self._beats % 1000 == 1:
            await rt.db.write(nodes.forget_before, now - FORGET_AFTER)

    def _published(self) -> str | None:
        """The figures to publish; None if they cannot be had: a fault in reading them must
        never stop the heartbeat, or the node would be declared dead and its work freed."""
        if self.metrics is None:
            return None
        try:
            return self.metrics()
        except Exception:
            log.exception("could not read this node's figures for /metrics; beating without")
            return None

    def statistics(self) -> NodeStatistics:
        return NodeStatistics(self._beats, self._reaped)


@dataclass(frozen=True, slots=True)
class NodeView:
    """A node as operators see it: `postroom nodes` and `GET /v1/admin/nodes`."""

    node: nodes.Node
    holds: dict[str, int]


async def listed(rt: Runtime) -> list[NodeView]:
    """Every node known to the database, newest first, with what each holds now."""
    return [NodeView(node, held.counts) for node, held in await rt.db.read(nodes.listed)]
