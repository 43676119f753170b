"""The engine supervisor: starts every long-lived actor and keeps it running, the OTP way.

Each actor is started with `nursery.start`, so the supervisor reports ready only when every
actor is. Afterwards an actor that raises is logged with its traceback, counted for
`/metrics` and started again after a back-off that doubles from `BACKOFF_FIRST` to
`BACKOFF_MAX` (and starts over once the actor has run for `STABLE`), while the other actors
go on: no input can stop the process. Items are isolated one level down (engine/platform/faults.py),
so an actor raising at all means something beyond one item went wrong.

An actor that lost the database is started again as soon as storage's probe finds it back
(storage/reachability.py), not after a back-off that grew through the outage: its node's
heartbeat and its work resume with the database. The one thing worth stopping for is the
database staying gone: when it has not answered a probe for `DATABASE_GRACE` without a break,
`DatabaseGone` ends the service with one clear line for the operator (systemd restarts it;
nothing accepted is lost, it is all in the database). How long it has been gone is storage's
to know, and starts over whenever the database answers, so outages never add up. An actor
that cannot start at all stops the start-up the same way.

`statistics()` gathers each actor's frozen snapshot for `/metrics` and `/healthz`.
"""

from __future__ import annotations

import logging
from typing import Any, Protocol

import trio

from engine.platform.faults import FaultLog, FaultStatistics
from storage.database import Database
from storage.errors import StorageFull, is_outage

BACKOFF_FIRST = 1.0  # seconds
BACKOFF_MAX = 60.0
STABLE = 60.0  # seconds an actor must run before its back-off starts over
DATABASE_GRACE = 60.0  # seconds the database may stay unreachable before the process stops
RECHECK = 1.0  # seconds between looks at a database that does not answer

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
        if is_outage(exc) and not isinstance(exc, StorageFull):
            log.error(
                "%s lost the database (%s); restarting when it answers", actor.name, _leaves(exc)
            )
            if await self._until_database_answers():
                backoff = BACKOFF_FIRST  # the outage was the fault, and it is over
        elif is_outage(exc):
            log.error("%s: %s; restarting in %.0f s", actor.name, _leaves(exc), backoff)
        else:
            log.error("%s raised; restarting in %.0f s", actor.name, backoff, exc_info=exc)
        await trio.sleep(backoff)

    async def _until_database_answers(self) -> bool:
        """Return once the database answers, True if it did not at first; raise DatabaseGone
        once storage has found it gone for DATABASE_GRACE."""
        waited = False
        while not await self._db.answers():
            waited = True
            down_for = self._db.unreachable_for()
            if down_for is not None and down_for > DATABASE_GRACE:
                raise DatabaseGone(
                    f"the database has not answered for {down_for:.0f} s; stopping"
                    " (check POSTROOM_DATABASE_URL and that the database is up, then start again)"
                )
            if down_for is None:  # not known gone yet (the probe is looking): look again soon
                await trio.sleep(RECHECK)
            else:
                with trio.move_on_after(RECHECK):
                    await self._db.until_reachable()
        return waited

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
