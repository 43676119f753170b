"""The retention sweeper: deletes the content of emails older than the workspace's period.

Each plan keeps bodies, attachments and raw messages for `RETENTION_DAYS` (Postmark keeps 45
days by default; ours grow with the plan); the email row keeps its metadata and events, so
the log and statistics stay whole. One node at a time sweeps (the leadership `retention`,
engine/nodes.py), every `INTERVAL`, in batches of `BATCH` emails, one unit of work each,
so several nodes never race and a large backlog never holds the writer for long; all state
is in the database (storage/retention.py), so a restart simply resumes.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import trio
import trio.lowlevel

from engine import nodes
from engine.runtime import Runtime
from storage import retention

RETENTION_DAYS = {"free": 30, "starter": 45, "pro": 90, "business": 365}
DEFAULT_DAYS = 30  # a plan not in the table (none today) keeps the least
INTERVAL = timedelta(hours=1)
BATCH = 500

log = logging.getLogger("postroom.retention")


def retention_of(plan: str) -> timedelta:
    """How long a workspace on `plan` keeps email content."""
    return timedelta(days=RETENTION_DAYS.get(plan, DEFAULT_DAYS))


@dataclass(frozen=True, slots=True)
class RetentionStatistics:
    rounds: int
    purged: int


class RetentionSweeper:
    name = "retention"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._purged = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._rt.clock.sleep_until(self._rt.clock.now() + INTERVAL)
            if await nodes.lead(self._rt, self.name):
                await self.sweep()

    async def sweep(self) -> int:
        """One round over every workspace; how many emails had their content deleted."""
        rt = self._rt
        self._rounds += 1
        purged = 0
        for workspace_id, plan in await rt.db.read(retention.workspaces):
            while True:
                now = rt.clock.now()
                done = await rt.db.write(
                    retention.purge_batch,
                    workspace_id,
                    now - retention_of(plan),
                    BATCH,
                    now,
                )
                purged += done
                if done < BATCH:
                    break
                await trio.lowlevel.checkpoint()  # let the hot path's writes in between batches
        self._purged += purged
        if purged:
            log.info("retention: content of %d emails deleted", purged)
        return purged

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(self._rounds, self._purged)
