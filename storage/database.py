"""The async face of storage: reads and writes handed to batching actors.

`Database.write` hands a unit of work to the group-commit writer: a thread of its own (two
on PostgreSQL, each with its own connection, `StorageEngine.writer_slots`) that takes
everything waiting, runs it in one transaction with one commit, then answers each caller.
Under load thousands of commits become dozens; a caller still hears back only after its own
data is durable. `Database.read` goes to a few reader threads that batch the same way on their
own connections. A batch costs one hand-over into its thread and one back, never one per
statement, and a worker with more waiting starts the next batch without waiting for Trio.

A unit submitted after another unit's answer always runs in a later batch, so callers read
their own writes. Units handed over at once may commit in either order on PostgreSQL, as
units of two nodes do: one that must follow another waits for its answer, and one that checks
a total before adding to it locks what it adds to first (storage/emails.py `sent_in_month`).

Topics of new work that committed units announced (`Tx.notify`) go to the `on_commit` hook
(the engine's wake-ups) once committed; `listen` hands it those other nodes announced.

While the database is known to be gone every call fails at once (storage/reachability.py), and
an outage error of any call makes the prober look.
"""

from __future__ import annotations

import contextvars
import logging
import queue
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Concatenate, ParamSpec, TypeVar

import outcome
import trio

from storage.engines import Job, StorageEngine, open_engine
from storage.errors import StorageFull, is_outage
from storage.reachability import Reachability
from storage.sealing import Sealer
from storage.tx import Dialect, Tx

P = ParamSpec("P")
# Seconds a listening thread waits before returning: also how long a stop waits for it (the
# thread is never abandoned, so its connection is always closed by the database's close).
LISTEN_WAIT = 0.25
LISTEN_RETRY = 1.0  # seconds between attempts to listen again after losing the connection
log = logging.getLogger("postroom.storage")
T = TypeVar("T")

MAX_BATCH = 1000


@dataclass(slots=True)
class _Pending:
    job: Job
    done: trio.Event = field(default_factory=trio.Event)
    result: outcome.Outcome[Any] | None = None


@dataclass(frozen=True, slots=True)
class BatcherStatistics:
    """A snapshot of a batching actor's work so far."""

    batches: int
    units: int
    largest_batch: int
    waiting: int
    unanswered: int  # units submitted and not answered yet: waiting, or in the running batch


class Batcher:
    """Actor pool that runs many callers' units of work in batches, on threads of its own.

    Each worker is a thread that takes every unit waiting, runs them as one batch and hands
    the answers back to Trio without waiting for Trio to take them: under load the next batch
    starts as soon as one ends. (Through `trio.to_thread`, every batch paid a hop into a
    thread and one back before the next could start: 0.65 ms of a 2 ms write cycle.)"""

    def __init__(
        self, run_batch: Callable[[Sequence[Job]], list[outcome.Outcome[Any]]], workers: int
    ) -> None:
        self._run_batch = run_batch
        self._workers = workers
        self._queue: queue.SimpleQueue[_Pending | None] = queue.SimpleQueue()
        self._closed = False
        self._batches = 0
        self._units = 0
        self._largest = 0
        self._unanswered = 0

    async def submit(self, job: Job) -> Any:
        """Run one unit of work durably; its result, or its exception re-raised."""
        if self._closed:
            # Closed because the service is being cancelled: a caller inside that
            # cancellation ends with it, not with an error of its own that would outlive it
            # (an actor's, escaping its supervisor among the Cancelled).
            await trio.lowlevel.checkpoint()
            raise trio.ClosedResourceError("the database is closing")
        pending = _Pending(job)
        self._unanswered += 1
        try:
            self._queue.put(pending)
            await pending.done.wait()
        finally:
            self._unanswered -= 1
        assert pending.result is not None
        return pending.result.unwrap()

    def close(self) -> None:
        """Stop taking work; the workers finish what is queued, then end."""
        if not self._closed:
            self._closed = True
            self._queue.put(None)  # each worker passes it on to the next as it ends

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        token = trio.lowlevel.current_trio_token()
        running = self._workers
        ended = trio.Event()

        def one_ended() -> None:
            nonlocal running
            running -= 1
            if not running:
                ended.set()

        def work() -> None:
            try:
                self._work(token)
            finally:
                token.run_sync_soon(one_ended)

        for n in range(self._workers):
            threading.Thread(target=work, name=f"postroom batcher {n}", daemon=True).start()
        task_status.started()
        try:
            await ended.wait()
        finally:
            # Cancelled from outside: a batch under way is never cut short (its connection
            # is closed after this returns), and what is queued still runs.
            self.close()
            with trio.CancelScope(shield=True):
                await ended.wait()

    def _work(self, token: trio.lowlevel.TrioToken) -> None:
        while (batch := self._take()) is not None:
            token.run_sync_soon(self._answer, batch, self._run(batch))
            # Not kept while waiting for the next batch: its arguments and results may be
            # whole messages (a 34 MiB one stayed resident until the next read).
            del batch

    def _take(self) -> list[_Pending] | None:
        """Every unit waiting, up to MAX_BATCH (blocking until there is one); None once the
        batcher is closed and what was queued before has been taken."""
        first = self._queue.get()
        if first is None:
            self._queue.put(None)  # for the next worker
            return None
        batch = [first]
        while len(batch) < MAX_BATCH:
            try:
                more = self._queue.get_nowait()
            except queue.Empty:
                break
            if more is None:
                self._queue.put(None)
                break
            batch.append(more)
        return batch

    def _run(self, batch: list[_Pending]) -> list[outcome.Outcome[Any]]:
        try:
            return self._run_batch([pending.job for pending in batch])
        except BaseException as exc:
            # The batch as a whole failed: every caller hears of it, and the worker lives on
            # (a worker that died would leave its callers waiting for good). One Error each:
            # an outcome can be unwrapped only once.
            return [outcome.Error(exc) for _ in batch]

    def _answer(self, batch: list[_Pending], results: list[outcome.Outcome[Any]]) -> None:
        self._batches += 1
        self._units += len(batch)
        self._largest = max(self._largest, len(batch))
        for pending, result in zip(batch, results, strict=True):
            pending.result = result
            pending.done.set()

    def statistics(self) -> BatcherStatistics:
        return BatcherStatistics(
            batches=self._batches,
            units=self._units,
            largest_batch=self._largest,
            waiting=self._queue.qsize(),
            unanswered=self._unanswered,
        )


def _in_caller_context(unit: Callable[..., T]) -> Callable[..., T]:
    """`unit`, to run in a copy of the submitting task's context variables, as
    `trio.to_thread` runs `transaction`'s: a batch runs on the batcher's thread, and the
    unit still sees what its caller set (engine/activity.py's attribution of a change)."""
    together = getattr(unit, "together", None)
    if together is not None:  # it runs with its batch's other calls, in no caller's context
        return unit
    wrapped = partial(contextvars.copy_context().run, unit)
    for mark in ("one_snapshot", "pipelined"):  # storage/engines.py's marks are kept
        if getattr(unit, mark, False):
            setattr(wrapped, mark, True)
    return wrapped


class Database:
    """Async access to one storage engine."""

    def __init__(
        self, engine: StorageEngine, reader: Batcher, writer: Batcher, reach: Reachability
    ) -> None:
        self._engine = engine
        self._reader = reader
        self._writer = writer
        self._reach = reach
        self.dialect: Dialect = engine.dialect
        self.writers = engine.writer_slots  # write transactions that may run at once
        self._deliver: Callable[[set[str]], None] = lambda topics: None
        # The listening thread is always out: it takes no token of trio's default limiter,
        # whose borrowed tokens then count only work under way (RunningService.idle).
        self._listening = trio.CapacityLimiter(1)

    def on_commit(self, deliver: Callable[[set[str]], None], node: str) -> None:
        """Hand the topics of committed work to `deliver` from now on, announcing them to the
        other nodes as `node`'s."""
        self._deliver = deliver
        self._engine.node = node

    def _deliver_notes(self) -> None:
        topics = self._engine.notes.take()
        if topics:
            self._deliver(topics)

    async def listen(self, deliver: Callable[[set[str]], None]) -> None:
        """Hand `deliver` the topics other nodes announce, until cancelled; return at once
        when the engine has no way to hear them (SQLite)."""
        failures = 0
        while True:
            try:
                self._reach.check()
                heard = await trio.to_thread.run_sync(
                    self._engine.hear, LISTEN_WAIT, limiter=self._listening
                )
            except Exception as exc:
                if not is_outage(exc):
                    raise
                self._reach.failed(exc)
                failures += 1
                if failures == 1:
                    log.warning("cannot listen for other nodes' work (%s); retrying", exc)
                # Back as soon as the database is: what was announced meanwhile is lost, and
                # the first `hear` of a new connection has every actor look anew.
                await trio.sleep(LISTEN_RETRY)
                await self._reach.until_back()
                continue
            failures = 0
            if heard is None:
                return
            if heard:
                deliver(heard)

    async def read(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a read-only unit of work on a reader connection."""
        self._reach.check()
        try:
            result: T = await self._reader.submit((_in_caller_context(unit), args))
        except Exception as exc:
            self._reach.failed(exc)
            raise
        return result

    async def write(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a unit of work through group commit; returns once it is durable."""
        self._reach.check()
        try:
            result: T = await self._writer.submit((_in_caller_context(unit), args))
        except Exception as exc:
            self._reach.failed(exc)
            raise
        finally:
            self._deliver_notes()
        return result

    async def transaction(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a large unit of work in a transaction of its own (bulk work, migrations)."""
        self._reach.check()
        try:
            result: T = await trio.to_thread.run_sync(self._engine.transaction, unit, args)
        except Exception as exc:
            self._reach.failed(exc)
            raise
        finally:
            self._deliver_notes()
        return result

    async def checkpoint(self) -> None:
        """Empty SQLite's write-ahead log into the database file (after an erasure, so no old
        page holding what was erased stays in the log); nothing on PostgreSQL."""
        await trio.to_thread.run_sync(self._engine.checkpoint)

    async def answers(self) -> bool:
        """Whether the database answers a trivial read now (False on an outage)."""
        try:
            await self.read(_ping)
        except Exception as exc:
            if not is_outage(exc):
                raise
            return False
        return True

    def unreachable_for(self) -> float | None:
        """Seconds since a probe found the database gone; None while it answers."""
        return self._reach.down_for()

    async def until_reachable(self) -> None:
        """Return once the database answers a probe (at once unless it is known to be gone)."""
        await self._reach.until_back()

    def use_master_key(self, sealer: Sealer) -> None:
        """Seal and unseal secrets at rest with `sealer` from now on (set once at start-up)."""
        self._engine.sealer = sealer

    @property
    def storage_full(self) -> StorageFull | None:
        """The last write refused for lack of space, until a later write stores something;
        None while writes have room."""
        return self._engine.space.full

    def writer_statistics(self) -> BatcherStatistics:
        return self._writer.statistics()

    def reader_statistics(self) -> BatcherStatistics:
        return self._reader.statistics()


@asynccontextmanager
async def open_database(url: str) -> AsyncIterator[Database]:
    """Open the database a URL names, with its writer actor running until exit."""
    engine = await trio.to_thread.run_sync(open_engine, url)
    try:
        reader = Batcher(engine.read_batch, workers=engine.reader_slots)
        writer = Batcher(engine.write_batch, workers=engine.writer_slots)
        reach = Reachability(engine.probe)
        async with trio.open_nursery() as nursery:
            await nursery.start(reader.run)
            await nursery.start(writer.run)
            await nursery.start(reach.run)
            try:
                yield Database(engine, reader, writer, reach)
            finally:
                reader.close()
                writer.close()
                reach.stop()
    finally:
        # Shielded: a service cancelled from outside still closes its connections.
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(engine.close)


def _ping(tx: Tx) -> Any:
    return tx.value("SELECT 1")
