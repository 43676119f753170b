"""The two storage engines: synchronous, called from worker threads one unit at a time.

A unit of work is a function `unit(tx, *args)` that runs inside one transaction. `write_batch`
runs many units in one transaction with one commit (group commit); each unit gets its own
savepoint, so one unit's error rolls back only that unit and is handed back to its caller.
`read_batch` runs many read-only units on one connection in one thread hop.
"""

from __future__ import annotations

import os
import queue
import sqlite3
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import outcome

from storage.tx import Dialect, Tx

T = TypeVar("T")
Unit = Callable[..., Any]
Job = tuple[Unit, tuple[Any, ...]]


class StorageEngine(Protocol):
    dialect: Dialect
    reader_slots: int

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]: ...

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]: ...

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any: ...

    def close(self) -> None: ...


def _run_isolated(tx: Tx, execute: Callable[[str], Any], jobs: Sequence[Job]) -> list[Any]:
    """Run jobs inside an open transaction, each in its own savepoint."""
    results: list[Any] = []
    for unit, args in jobs:
        execute("SAVEPOINT unit")
        result = outcome.capture(unit, tx, *args)
        if isinstance(result, outcome.Error):
            execute("ROLLBACK TO SAVEPOINT unit")
        execute("RELEASE SAVEPOINT unit")
        results.append(result)
    return results


class SQLiteEngine:
    """The embedded default: one writer connection, a few reader connections, WAL."""

    dialect: Dialect = "sqlite"

    def __init__(self, path: str, readers: int = 4) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self._writer = self._connect()
        self.reader_slots = readers
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        for _ in range(readers):
            self._readers.put(self._connect())
        self._write_lock = threading.Lock()

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        conn.row_factory = sqlite3.Row
        # WAL lets readers run beside the writer; FULL makes a commit survive power loss.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        return conn

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        if len(jobs) == 1:
            return [outcome.capture(self.transaction, *jobs[0])]
        return self._in_write_transaction(
            lambda conn: _run_isolated(Tx(conn, "sqlite"), conn.execute, jobs)
        )

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any:
        return self._in_write_transaction(lambda conn: unit(Tx(conn, "sqlite"), *args))

    def _in_write_transaction(self, body: Callable[[sqlite3.Connection], T]) -> T:
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(conn)
            except BaseException:
                conn.execute("ROLLBACK")
                raise
            conn.execute("COMMIT")
            return result

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        conn = self._readers.get()
        try:
            # One snapshot for the whole batch; a failed read leaves nothing to undo.
            conn.execute("BEGIN")
            try:
                tx = Tx(conn, "sqlite")
                return [outcome.capture(unit, tx, *args) for unit, args in jobs]
            finally:
                conn.execute("COMMIT")
        finally:
            self._readers.put(conn)

    def close(self) -> None:
        self._writer.close()
        while not self._readers.empty():
            self._readers.get().close()


class PostgresEngine:
    """PostgreSQL through psycopg 3 and a psycopg_pool connection pool."""

    dialect: Dialect = "postgresql"

    def __init__(self, url: str, pool_size: int = 8) -> None:
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        self.reader_slots = pool_size - 1
        self._pool: ConnectionPool[Any] = ConnectionPool(
            url,
            min_size=2,
            max_size=pool_size,
            kwargs={"row_factory": dict_row, "autocommit": False},
            open=False,
        )
        self._pool.open(wait=True, timeout=10.0)

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        if len(jobs) == 1:
            return [outcome.capture(self.transaction, *jobs[0])]
        with self._pool.connection() as conn, conn.transaction():
            return _run_isolated(Tx(conn, "postgresql"), conn.execute, jobs)

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any:
        with self._pool.connection() as conn, conn.transaction():
            return unit(Tx(conn, "postgresql"), *args)

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        with self._pool.connection() as conn:
            tx = Tx(conn, "postgresql")
            results: list[outcome.Outcome[Any]] = []
            for unit, args in jobs:
                result = outcome.capture(unit, tx, *args)
                if isinstance(result, outcome.Error):
                    conn.rollback()  # an error aborts the transaction; the next read opens anew
                results.append(result)
            conn.commit()
            return results

    def close(self) -> None:
        self._pool.close()


def open_engine(url: str) -> StorageEngine:
    """Open the engine a database URL names; ValueError for an unknown scheme."""
    if url.startswith("sqlite:///"):
        return SQLiteEngine(os.path.expanduser(url.removeprefix("sqlite:///")))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresEngine(url)
    raise ValueError("must start with sqlite:/// or postgresql://")
