"""Retention: how long a workspace keeps content, and the sweeper that deletes it after.

Each plan keeps bodies, attachments, raw messages, inbound copies and the mail kept from
postmaster@ and abuse@ (counted with the inbound copies) for `RETENTION_DAYS`
(Postmark keeps 45 days by default; ours grow with the plan); a workspace may keep less
(`GET|PUT /v1/privacy/retention`), never more than its plan's period, which is also the
longest (a downgrade shortens it at once). The email row keeps its metadata and events, so
the log and statistics stay whole. One node at a time sweeps (the leadership `retention`,
engine/platform/nodes.py), every `INTERVAL`, in batches of `BATCH` rows, one unit of work each, so
several nodes never race and a large backlog never holds the writer for long; all state is
in the database (storage/retention.py), so a restart simply resumes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import trio
import trio.lowlevel

from engine.activity import Change, record
from engine.platform import nodes
from engine.platform.errors import Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import postmaster_mail, retention
from storage.retention import WorkspaceRetention
from storage.tx import Tx

RETENTION_DAYS = {"free": 30, "starter": 45, "pro": 90, "business": 365}
DEFAULT_DAYS = 30  # a plan not in the table (none today) keeps the least
INTERVAL = timedelta(hours=1)
BATCH = 500

log = logging.getLogger("postroom.retention")

# A batch of one kind of sweeping: (tx, workspace, before, limit, now) -> rows done.
Purge = Callable[[Tx, str, datetime, int, datetime], int]


def plan_days(plan: str) -> int:
    """The plan's retention period in days: the default and the longest a workspace may set."""
    return RETENTION_DAYS.get(plan, DEFAULT_DAYS)


@dataclass(frozen=True, slots=True)
class Retention:
    """A workspace's retention: what applies, its own setting, and its plan's period."""

    days: int
    custom_days: int | None
    plan_days: int


def _of(stored: WorkspaceRetention) -> Retention:
    most = plan_days(stored.plan)
    days = most if stored.days is None else min(stored.days, most)
    return Retention(days, stored.days, most)


async def current(rt: Runtime, who: Principal) -> Retention:
    """The caller's workspace's retention."""
    return _of(await rt.db.read(retention.workspace, who.workspace_id))


def _change(tx: Tx, who: Principal, days: int | None, now: datetime) -> Retention:
    stored = retention.workspace(tx, who.workspace_id)
    most = plan_days(stored.plan)
    if days is not None and not 1 <= days <= most:
        message = f"days must be between 1 and {most}, the {stored.plan} plan's retention period"
        raise Unprocessable(message, errors=[{"loc": ["body", "days"], "msg": message}])
    retention.set_days(tx, who.workspace_id, days)
    meta = {"days": days, "previous_days": stored.days}
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("privacy.retention_changed", "retention", None, meta),
        now,
    )
    return _of(WorkspaceRetention(stored.workspace_id, stored.plan, days))


async def change(rt: Runtime, who: Principal, days: int | None) -> Retention:
    """Set the workspace's own period (None: its plan's); 422 beyond the plan's period."""
    changed: Retention = await rt.db.write(_change, who, days, rt.clock.now())
    return changed


@dataclass(frozen=True, slots=True)
class RetentionStatistics:
    rounds: int
    purged: int
    inbound_deleted: int


class RetentionSweeper:
    name = "retention"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._purged = 0
        self._inbound_deleted = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._rt.clock.sleep_until(self._rt.clock.now() + INTERVAL)
            if await nodes.lead(self._rt, self.name):
                await self.sweep()

    async def sweep(self) -> int:
        """One round over every workspace; how many emails had their content deleted."""
        self._rounds += 1
        purged = inbound_deleted = 0
        for stored in await self._rt.db.read(retention.workspaces):
            period = timedelta(days=_of(stored).days)
            purged += await self._batches(retention.purge_batch, stored.workspace_id, period)
            inbound_deleted += await self._batches(
                retention.purge_inbound_batch, stored.workspace_id, period
            )
            inbound_deleted += await self._batches(
                postmaster_mail.purge_batch, stored.workspace_id, period
            )
        self._purged += purged
        self._inbound_deleted += inbound_deleted
        if purged or inbound_deleted:
            log.info(
                "retention: content of %d emails and %d inbound messages deleted",
                purged,
                inbound_deleted,
            )
        return purged

    async def _batches(self, purge: Purge, workspace_id: str, period: timedelta) -> int:
        """Run `purge` batch after batch until one finds less than a full batch; the total."""
        total = 0
        while True:
            now = self._rt.clock.now()
            done: int = await self._rt.db.write(purge, workspace_id, now - period, BATCH, now)
            total += done
            if done < BATCH:
                return total
            await trio.lowlevel.checkpoint()  # let the hot path's writes in between batches

    def statistics(self) -> RetentionStatistics:
        return RetentionStatistics(self._rounds, self._purged, self._inbound_deleted)
