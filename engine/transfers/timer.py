"""The transfer timer actor: expires pending transfers after 7 days and completes accepted
ones when their 24-hour safety window ends.

It keeps no state of its own: deadlines are columns of the transfers, so on start (and after
every round) it asks the database for the earliest one and sleeps until then with the engine
clock. Initiating or accepting a transfer on any node wakes it (`transfers`,
engine/platform/wakeups.py), and it looks again at least every `POLL`. It runs on one node at a time
(the leadership `transfer_timer`, engine/platform/nodes.py), which moves when that node dies; a
transition is a conditional update anyway, so two nodes applying one deadline move the domain
once.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta

import trio

from engine.platform import nodes
from engine.platform.runtime import Runtime
from engine.transfers import actions as transfers

POLL = timedelta(minutes=1)

log = logging.getLogger("postroom.transfers")


@dataclass(frozen=True, slots=True)
class TransferTimerStatistics:
    rounds: int
    expired: int
    completed: int
    next_deadline: datetime | None


class TransferTimer:
    name = "transfer_timer"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._counts: dict[str, int] = {}
        self._next: datetime | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        clock = self._rt.clock
        wakeups = self._rt.wakeups.transfers.receive
        while True:
            if await nodes.lead(self._rt, self.name):
                await self.round()
            now = clock.now()
            wait_until = min(self._next or now + POLL, now + POLL)
            with trio.move_on_at(clock.deadline_for(wait_until)):
                await wakeups.receive()
            while True:  # one round serves every wake-up that arrived meanwhile
                try:
                    wakeups.receive_nowait()
                except trio.WouldBlock:
                    break

    async def round(self) -> None:
        """Apply every deadline that has passed, then note the next one."""
        self._rounds += 1
        for state, count in (await transfers.apply_deadlines(self._rt)).items():
            self._counts[state] = self._counts.get(state, 0) + count
            log.info("%d domain transfers %s", count, state)
        self._next = await transfers.next_deadline(self._rt)

    def statistics(self) -> TransferTimerStatistics:
        return TransferTimerStatistics(
            self._rounds,
            self._counts.get("expired", 0),
            self._counts.get("completed", 0),
            self._next,
        )
