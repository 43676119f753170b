"""The async face of storage: reads in worker threads, writes through group commit.

`Database.write` hands a unit of work to the `GroupCommitWriter` actor, which takes
everything waiting on its channel, runs it in one transaction with one commit, then answers
each caller. Under load thousands of commits become dozens; a caller still hears back only
after its own data is durable. Each batch is one thread hop, never one per statement.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any, Concatenate, ParamSpec, TypeVar

import outcome
import trio

from storage.engines import Job, StorageEngine, open_engine
from storage.tx import Dialect, Tx

P = ParamSpec("P")
T = TypeVar("T")

MAX_BATCH = 1000


@dataclass(slots=True)
class _PendingWrite:
    job: Job
    done: trio.Event = field(default_factory=trio.Event)
    result: outcome.Outcome[Any] | None = None


@dataclass(frozen=True, slots=True)
class WriterStatistics:
    """A snapshot of the group-commit writer's work so far."""

    batches: int
    units: int
    largest_batch: int
    waiting: int


class GroupCommitWriter:
    """Actor that commits many callers' units of work in one transaction."""

    def __init__(self, engine: StorageEngine) -> None:
        self._engine = engine
        self._send, self._receive = trio.open_memory_channel[_PendingWrite](MAX_BATCH)
        self._batches = 0
        self._units = 0
        self._largest = 0

    async def submit(self, job: Job) -> Any:
        """Run one unit of work durably; its result, or its exception re-raised."""
        pending = _PendingWrite(job)
        await self._send.send(pending)
        await pending.done.wait()
        assert pending.result is not None
        return pending.result.unwrap()

    def close(self) -> None:
        """Stop taking work; the actor finishes what is queued, then returns."""
        self._send.close()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with self._receive:
            async for first in self._receive:
                batch = [first]
                while len(batch) < MAX_BATCH:
                    try:
                        batch.append(self._receive.receive_nowait())
                    except (trio.WouldBlock, trio.EndOfChannel):
                        break
                await self._commit(batch)

    async def _commit(self, batch: list[_PendingWrite]) -> None:
        jobs = [pending.job for pending in batch]
        try:
            results = await trio.to_thread.run_sync(self._engine.write_batch, jobs)
        except Exception as exc:  # the commit itself failed: every caller hears of it
            results = [outcome.Error(exc)] * len(batch)
        self._batches += 1
        self._units += len(batch)
        self._largest = max(self._largest, len(batch))
        for pending, result in zip(batch, results, strict=True):
            pending.result = result
            pending.done.set()

    def statistics(self) -> WriterStatistics:
        return WriterStatistics(
            batches=self._batches,
            units=self._units,
            largest_batch=self._largest,
            waiting=self._send.statistics().current_buffer_used,
        )


class Database:
    """Async access to one storage engine."""

    def __init__(self, engine: StorageEngine, writer: GroupCommitWriter) -> None:
        self._engine = engine
        self._writer = writer
        self._readers = trio.CapacityLimiter(engine.reader_slots)
        self.dialect: Dialect = engine.dialect

    async def read(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a read-only unit of work on a reader connection."""
        async with self._readers:
            result: T = await trio.to_thread.run_sync(self._engine.read, unit, args)
            return result

    async def write(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a unit of work through group commit; returns once it is durable."""
        result: T = await self._writer.submit((unit, args))
        return result

    async def transaction(self, unit: Callable[Concatenate[Tx, P], T], *args: Any) -> T:
        """Run a large unit of work in a transaction of its own (bulk work, migrations)."""
        result: T = await trio.to_thread.run_sync(self._engine.transaction, unit, args)
        return result

    def writer_statistics(self) -> WriterStatistics:
        return self._writer.statistics()


@asynccontextmanager
async def open_database(url: str) -> AsyncIterator[Database]:
    """Open the database a URL names, with its writer actor running until exit."""
    engine = await trio.to_thread.run_sync(open_engine, url)
    try:
        writer = GroupCommitWriter(engine)
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            try:
                yield Database(engine, writer)
            finally:
                writer.close()
    finally:
        await trio.to_thread.run_sync(engine.close)
