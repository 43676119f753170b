"""The broadcast recovery actor: fails the broadcasts whose queuing a stopped or dead node cut
short, so none stays `sending` for ever.

A bulk send queues its list in chunks on the node that took the request; a node that stops or
dies mid-way leaves the broadcast `sending` (engine/contacts/bulk_send.py). A node fails its
own at start-up (postroom/service.py); this actor fails the ones of a node another reaped
(the reaper announces `rescan`, engine/platform/wakeups.py) and any that made no progress for
STALE_AFTER, which it looks for at least that often. It runs on one node at a time (the
leadership `broadcast_recovery`), so no broadcast is closed twice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import trio

from engine.contacts.bulk_send import STALE_AFTER, fail_interrupted
from engine.platform import nodes
from engine.platform.runtime import Runtime

log = logging.getLogger("postroom.broadcasts")


@dataclass(frozen=True, slots=True)
class BroadcastRecoveryStatistics:
    rounds: int
    failed: int


class BroadcastRecovery:
    name = "broadcast_recovery"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._failed = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        clock = self._rt.clock
        wakeups = self._rt.wakeups.broadcasts.receive
        while True:
            with trio.move_on_at(clock.deadline_for(clock.now() + STALE_AFTER)):
                await wakeups.receive()
            while True:  # one round serves every wake-up that arrived meanwhile
                try:
                    wakeups.receive_nowait()
                except trio.WouldBlock:
                    break
            if await nodes.lead(self._rt, self.name):
                await self.round()

    async def round(self) -> None:
        self._rounds += 1
        if failed := await fail_interrupted(self._rt):
            self._failed += failed
            log.warning("%d broadcasts left sending by a stopped node: marked failed", failed)

    def statistics(self) -> BroadcastRecoveryStatistics:
        return BroadcastRecoveryStatistics(self._rounds, self._failed)
