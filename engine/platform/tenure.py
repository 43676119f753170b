"""How long this node may trust that it still holds its leases: the fence before every SMTP
transaction.

Other nodes free everything a node holds once its heartbeat is `DEAD_AFTER` old
(engine/platform/nodes.py), whether it crashed or only stalled (a stopped process, a GC pause, a frozen
VM, a partition). A stalled node that woke up and sent what it had claimed and built before
would deliver mail another node has delivered meanwhile. So a node trusts its leases only for
`TRUST` after the start of its last successful heartbeat, which renewed them all: that ends
before any other node may declare it dead. Past it, whoever wants to start a transaction
waits for a fresh beat. A beat that finds the node declared dead ends the node's `epoch`:
everything claimed in an earlier epoch was freed and may be delivered elsewhere, so it is
dropped, never sent and never recorded.

Only the node keeper (engine/platform/nodes.py) moves a tenure; without one (a runtime no keeper
watches) the leases are trusted always.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import trio

# Seconds before DEAD_AFTER at which a node stops trusting its last beat: room for the time a
# beat takes to commit and for clocks of different hosts that disagree a little.
MARGIN = 5.0


@dataclass(frozen=True, slots=True)
class TenureStatistics:
    epoch: int  # times this node found itself declared dead
    confirmations: int  # beats asked for because the last one was too old to trust


class Tenure:
    """This node's trust in its leases; moved by its heartbeat, asked before each transaction."""

    def __init__(self) -> None:
        self.epoch = 0
        self._trusted_until = math.inf  # Trio time; no keeper: trusted always
        self._wanted = trio.Event()  # someone waits for a beat
        self._beaten = trio.Event()  # a beat ended (its result is in epoch and trusted_until)
        self._confirmations = 0
        self._last_beat = -math.inf  # Trio time the last committed beat began

    def held(self, epoch: int) -> bool:
        """Whether leases taken in `epoch` may be trusted now, without asking the database."""
        return epoch == self.epoch and trio.current_time() < self._trusted_until

    async def hold(self, epoch: int) -> bool:
        """Whether leases taken in `epoch` are still this node's, waiting for a heartbeat when
        the last one is too old to trust. False: they were freed (the node was declared dead);
        whatever was claimed with them must be dropped."""
        asked = trio.current_time()
        if asked < self._trusted_until:
            return epoch == self.epoch
        self._confirmations += 1
        # A beat begun after the question answers it, however long it took to commit.
        while epoch == self.epoch and self._last_beat < asked:
            beaten = self._beaten
            self._wanted.set()
            await beaten.wait()
        return epoch == self.epoch

    # -- the node keeper's side --------------------------------------------------------

    async def wanted(self) -> None:
        """Return when a task waits for a heartbeat to trust its leases."""
        await self._wanted.wait()

    def beaten(self, started: float, alive: bool, trust: float) -> None:
        """A heartbeat that began at Trio time `started` committed: it renewed every lease
        (`alive`), or found the node declared dead and its leases freed. Trusted for `trust`
        seconds from `started`."""
        if not alive:
            self.epoch += 1
        self._trusted_until = started + trust
        self._last_beat = started
        self._wanted = trio.Event()
        self._beaten.set()
        self._beaten = trio.Event()

    def statistics(self) -> TenureStatistics:
        return TenureStatistics(self.epoch, self._confirmations)
