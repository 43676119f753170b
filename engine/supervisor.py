"""The engine supervisor: starts every long-lived actor and keeps it running, the OTP way.

Each actor is started with `nursery.start`, so the supervisor reports ready only when every
actor is. Afterwards an actor that raises is logged with its traceback, counted for
`/metrics` and started again after a back-off that doubles from `BACKOFF_FIRST` to
`BACKOFF_MAX` (and starts over once the actor has run for `STABLE`), while the other actors
go on: no input can stop the process. Items are isolated one level down (engine/faults.py),
so an actor raising at all means something beyond one item went wrong.

The one thing worth stopping for is the database staying gone: when an actor raises and the
database has not answered for `DATABASE_GRACE`, `DatabaseGone` ends the service with one
clear line for the operator (systemd restarts it; nothing accepted is lost, it is all in the
database). An actor that cannot start at all stops the start-up the same way.

`statistics()` gathers each actor's frozen snapshot for `/metrics` and `/healthz`.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from engine.faults import FaultLog, FaultStatistics
from storage.database import Database
from storage.errors import is_outage

BACKOFF_FIRST = 1.0  # seconds
BACKOFF_MAX = 60.0
STABLE = 60.0  # seconds an actor must run before its back-off starts over
DATABASE_GRACE = 60.0  # seconds the database may stay unreachable before the process stops
PROBE_TIMEOUT = 5.0

log = logging.getLogger("postroom.supervisor")


class DatabaseGone(Exception):
    """Raised when the database has been unreachable for `DATABASE_GRACE`: the service stops."""


class Actor(Protocol):
    name: str

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    def statistics(self) -> Any: ...


class Supervisor:
    def __init__(self, actors: list[Actor], db: Database, fault_log: FaultLog) -> None:
        self._actors = actors
        self._db = db
        self._faults = fault_log
        self._running = False
        self._database_down_since: float | None = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for actor in self._actors:
                await nursery.start(self._keep_running, actor)
            self._running = True
            task_status.started()
        self._running = False

    async def _keep_running(
        self, actor: Actor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Run `actor`, starting it again after back-off whenever it raises."""
        backoff = BACKOFF_FIRST
        first = True
        while True:
            began = trio.current_time()
            try:
                async with trio.open_nursery() as nursery:
                    await nursery.start(_started_actor, actor)
                    if first:
                        first = False
                        task_status.started()
                return  # the actor finished its work of its own accord
            except Exception as exc:
                if first:
                    raise  # it could not start: the start-up fails with the real error
                if trio.current_time() - began > STABLE:
                    backoff = BACKOFF_FIRST
                await self._restart_after(actor, exc, backoff)
                backoff = min(backoff * 2, BACKOFF_MAX)

    async def _restart_after(self, actor: Actor, exc: Exception, backoff: float) -> None:
        self._faults.restarted(actor.name)
        if is_outage(exc):
            log.error(
                "%s lost the database (%s); restarting in %.0f s", actor.name, _leaves(exc), backoff
            )
            await self._check_database()
        else:
            log.error("%s raised; restarting in %.0f s", actor.name, backoff, exc_info=exc)
        await trio.sleep(backoff)

    async def _check_database(self) -> None:
        """Raise DatabaseGone once the database has not answered for DATABASE_GRACE."""
        answered = False
        with trio.move_on_after(PROBE_TIMEOUT):
            try:
                await self._db.read(_ping)
                answered = True
            except Exception as exc:
                if not is_outage(exc):
                    raise
        now = trio.current_time()
        if answered:
            self._database_down_since = None
            return
        if self._database_down_since is None:
            self._database_down_since = now
        elif now - self._database_down_since > DATABASE_GRACE:
            raise DatabaseGone(
                f"the database has not answered for {DATABASE_GRACE:.0f} s; stopping"
                " (check POSTROOM_DATABASE_URL and that the database is up, then start again)"
            )

    @property
    def running(self) -> bool:
        return self._running

    def statistics(self) -> dict[str, Any]:
        """Each actor's latest snapshot, by actor name."""
        return {actor.name: actor.statistics() for actor in self._actors}

    def fault_statistics(self) -> FaultStatistics:
        """Item faults, quarantines and restarts per actor since start."""
        return self._faults.statistics()


async def _started_actor(
    actor: Actor, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
) -> None:
    await actor.run(task_status=task_status)


def _leaves(exc: BaseException) -> str:
    """What went wrong, without the task groups it travelled through."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(_leaves(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}".strip()


def _ping(tx: Any) -> Any:
    return tx.value("SELECT 1")
