"""Wake-ups: the one way an actor hears that there is new work for it, on any node.

New work is named by a topic: `mail:<recipient domain>`, `webhooks`, `forwards`, `transfers`,
`key:<id>` (an API key revoked: evict it from the cache), `keys` (plans changed: evict all),
`rescan` (look at everything again: a node died, or announcements may have been missed;
broadcast recovery hears only this one).

Topics reach the hub two ways, both ending in `deliver`: a unit of work that makes work
announces it with `Tx.notify` (delivered here once committed, and on PostgreSQL sent to
every other node by NOTIFY in the same transaction); engine code that knows better when to
wake (a bulk send wakes delivery once, after its last chunk) calls `announce`, which wakes
this node at once and has the `Announcer` tell the others. Each node's `Database.listen`
hands what the others announced to `deliver`. Actors still look at the database on a slow
timer, a safety net only.

Waking never blocks and never loses work: the database holds all of it, so a full channel
turns into a rescan.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import trio

from engine.platform.key_cache import KeyCache
from storage.database import Database
from storage.tx import Tx

CAPACITY = 10_000
RESCAN = "rescan"


class Wakeups:
    """One actor's wake-ups: a channel of topic arguments (recipient domains for delivery)."""

    def __init__(self) -> None:
        self._send, self.receive = trio.open_memory_channel[str](CAPACITY)
        self.overflowed = False

    def wake(self, items: Iterable[str]) -> None:
        """Note new work (callable from any Trio task; never blocks)."""
        for item in items:
            try:
                self._send.send_nowait(item)
            except trio.WouldBlock:
                self.overflowed = True  # the receiver rescans the database
            except trio.ClosedResourceError:
                return  # shutting down: the next start rescans the database

    def rescan(self) -> None:
        """Ask the receiver to look at the whole database again."""
        self.overflowed = True
        self.wake([RESCAN])

    def close(self) -> None:
        """No actor of this node takes these wake-ups: drop them from now on."""
        self._send.close()


@dataclass(frozen=True, slots=True)
class WakeupStatistics:
    delivered: int  # topics delivered to this node's actors
    announced: int  # topics told to the other nodes by `announce`


class WakeupHub:
    """Routes topics to the actors waiting for them."""

    def __init__(self, key_cache: KeyCache) -> None:
        self.mail = Wakeups()
        self.webhooks = Wakeups()
        self.forwards = Wakeups()
        self.transfers = Wakeups()
        self.broadcasts = Wakeups()
        self._key_cache = key_cache
        self._outgoing: set[str] = set()
        self._has_outgoing = trio.Event()
        self._delivered = 0
        self._announced = 0

    def deliver(self, topics: Iterable[str]) -> None:
        """Wake this node's actors for each topic."""
        domains = []
        for topic in topics:
            self._delivered += 1
            kind, _, argument = topic.partition(":")
            if kind == "mail":
                domains.append(argument)
            elif kind == "webhooks":
                self.webhooks.wake([kind])
            elif kind == "forwards":
                self.forwards.wake([kind])
            elif kind == "transfers":
                self.transfers.wake([kind])
            elif kind == "key":
                self._key_cache.evict(argument)
            elif kind == "keys":
                self._key_cache.clear()
            elif kind == RESCAN:
                for wakeups in (
                    self.mail,
                    self.webhooks,
                    self.forwards,
                    self.transfers,
                    self.broadcasts,
                ):
                    wakeups.rescan()
        self.mail.wake(domains)

    def close_actors(self) -> None:
        """This node runs no actor (an intake worker): the others hear of its work."""
        for wakeups in (self.mail, self.webhooks, self.forwards, self.transfers, self.broadcasts):
            wakeups.close()

    def announce(self, topics: Iterable[str]) -> None:
        """Wake this node at once for work already committed, and the others soon."""
        topics = set(topics)
        self.deliver(topics)
        self._outgoing |= topics
        self._has_outgoing.set()

    async def run_announcer(self, db: Database) -> None:
        """Tell the other nodes what `announce` was told, batched (a task of the node)."""
        while True:
            await self._has_outgoing.wait()
            self._has_outgoing = trio.Event()
            topics, self._outgoing = self._outgoing, set()
            await db.write(_notify, sorted(topics))
            self._announced += len(topics)

    def statistics(self) -> WakeupStatistics:
        return WakeupStatistics(self._delivered, self._announced)


class WakeupRelay:
    """The actor that carries wake-ups between nodes: it hears what the others announce and
    tells them what `announce` was told here."""

    name = "wakeups"

    def __init__(self, hub: WakeupHub, db: Database) -> None:
        self._hub = hub
        self._db = db

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._db.listen, self._hub.deliver)
            nursery.start_soon(self._hub.run_announcer, self._db)
            task_status.started()

    def statistics(self) -> WakeupStatistics:
        return self._hub.statistics()


def _notify(tx: Tx, topics: list[str]) -> None:
    for topic in topics:
        tx.notify(topic)
