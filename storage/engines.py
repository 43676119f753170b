"""The two storage engines: synchronous, called from worker threads one unit at a time.

A unit of work is a function `unit(tx, *args)` that runs inside one transaction. `write_batch`
runs many units in one transaction with one commit (group commit); each unit gets its own
savepoint, so one unit's error rolls back only that unit and is handed back to its caller.
`read_batch` runs many read-only units on one connection in one thread hop.

Driver errors are translated here, at the edge (storage/errors.py): a full disk is
`StorageFull` on either engine, and each engine's `space` tells whether writes have room.

Topics a unit announces (`Tx.notify`) are kept only if the unit commits: they are collected
for the database's wake-ups (`take_notes`) and sent to every other node inside the same
transaction, so an announcement arrives exactly when its work is visible: on PostgreSQL with
`pg_notify`; on SQLite, whose nodes are the worker processes of one host, as a row of the
engine's own `_signals` table that the others poll (`hear`, every `_SIGNALS_POLL`): the
intake workers of `serve --workers N` leave their mail to the delivery workers.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import random
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from functools import partial
from pathlib import Path
from typing import Any, Protocol, TypeVar

import outcome

from storage.errors import StorageFull, storage_error
from storage.sealing import NO_MASTER_KEY, Sealer
from storage.tx import Dialect, Tx

T = TypeVar("T")
U = TypeVar("U", bound=Callable[..., Any])
Unit = Callable[..., Any]
Job = tuple[Unit, tuple[Any, ...]]

log = logging.getLogger("postroom.storage")


class SpaceWatch:
    """Whether the database has room for writes, for /healthz and /metrics.

    A write refused for lack of space sets `full`; the next write that stores new rows
    clears it. A write that only updates rows in place (a heartbeat, a lease renewal) or
    stores nothing (an actor's poll that found no work) proves nothing and changes nothing. Set on the writing thread, read on Trio's: one reference.
    """

    def __init__(self) -> None:
        self.full: StorageFull | None = None

    @contextmanager
    def refusals(self) -> Iterator[None]:
        """Translate driver errors raised inside; a `StorageFull` marks the database full."""
        try:
            yield
        except Exception as exc:
            error = storage_error(exc)
            if isinstance(error, StorageFull):
                self._refused(error)
            if error is exc:
                raise
            raise error from exc

    def settle(self, results: Sequence[outcome.Outcome[Any]], stored: bool) -> None:
        """After a committed write: full if one of its units found no room, else clear once
        it stored new rows."""
        for result in results:
            if isinstance(result, outcome.Error) and isinstance(result.error, StorageFull):
                self._refused(result.error)
                return
        if stored and self.full is not None:
            log.warning("the database has room again: writes are accepted")
            self.full = None

    def _refused(self, error: StorageFull) -> None:
        if self.full is None:
            log.error(
                "the database is full (%s): writes are refused until space returns",
                error.__cause__ or error,
            )
        self.full = error


class Notes:
    """Topics of committed units, waiting to be taken by the database's wake-ups. Filled on
    the writing thread, taken on Trio's."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._topics: set[str] = set()

    def add(self, topics: set[str]) -> None:
        if topics:
            with self._lock:
                self._topics |= topics

    def take(self) -> set[str]:
        with self._lock:
            taken, self._topics = self._topics, set()
        return taken


NOTIFY_CHANNEL = "postroom"
_CONFLICTS = ("40001", "40P01")  # serialization failure, deadlock detected
CONFLICT_ATTEMPTS = 5  # runs of a write transaction PostgreSQL undid to resolve a deadlock
# SQLite's announcements between the processes sharing a file: rows polled by each (`hear`).
_SIGNALS_TABLE = (
    "CREATE TABLE IF NOT EXISTS _signals"
    " (seq INTEGER PRIMARY KEY AUTOINCREMENT, node TEXT NOT NULL, topics TEXT NOT NULL)"
)
# Delivery waits at most this long to hear of mail another worker accepted; a poll is one
# indexed read of an empty range.
_SIGNALS_POLL = 0.05  # seconds
# Rows kept (between this and twice as many): a process polls far more often than this many
# commits.
_SIGNALS_KEPT = 1000
_NOTIFY_BYTES = 7000  # PostgreSQL's payload limit is 8000 bytes
POOL_WAIT = 5.0  # seconds work waits for a pooled PostgreSQL connection before it fails
PROBE_CONNECT_TIMEOUT = 2  # seconds (libpq's minimum) a probe waits to connect
# Every PostgreSQL connection gives up on a host that went silent (a power cut sends no
# reset): connecting after PROBE_CONNECT_TIMEOUT, idle after about 10 s of unanswered
# keep-alives, sending after 10 s unacknowledged.
_CONNECTION_LIMITS: dict[str, Any] = {
    "connect_timeout": PROBE_CONNECT_TIMEOUT,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10_000,  # milliseconds
}


def notify_payloads(node: str, topics: set[str]) -> list[str]:
    """The NOTIFY payloads announcing `topics` for `node`: its id, then one topic a line."""
    payloads: list[str] = []
    lines = [node]
    size = len(node.encode())
    for topic in sorted(topics):
        grown = size + 1 + len(topic.encode())
        if grown > _NOTIFY_BYTES and len(lines) > 1:
            payloads.append("\n".join(lines))
            lines, grown = [node], len(node.encode()) + 1 + len(topic.encode())
        lines.append(topic)
        size = grown
    if len(lines) > 1:
        payloads.append("\n".join(lines))
    return payloads


class StorageEngine(Protocol):
    dialect: Dialect
    reader_slots: int
    # Write transactions that may run at once, each on its own connection: one on SQLite
    # (one writer per file), two on PostgreSQL (docs/architecture.md section 4).
    writer_slots: int
    sealer: Sealer
    space: SpaceWatch
    notes: Notes
    node: str  # who announces, so a node ignores its own NOTIFYs

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]: ...

    def hear(self, timeout: float) -> set[str] | None:
        """Topics other nodes announced, waiting up to `timeout` seconds; None when the engine
        has no way to hear them (SQLite: its nodes share no channel)."""
        ...

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]: ...

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any: ...

    def checkpoint(self) -> None:
        """Move what the write-ahead log holds into the database and empty the log, where the
        engine's files are its own (SQLite); nothing where they are not (PostgreSQL)."""
        ...

    def probe(self, renew: bool) -> None:
        """Return when the database answers on a fresh connection, the engine's own
        connections usable again (all of them new with `renew`: it was gone); raise,
        quickly, when it does not answer."""
        ...

    def close(self) -> None: ...


def _capture(unit: Unit, tx: Tx, args: tuple[Any, ...]) -> outcome.Outcome[Any]:
    """One unit's result, or its error translated as at the edge (it goes to its caller)."""
    result = outcome.capture(unit, tx, *args)
    if isinstance(result, outcome.Error):
        return outcome.Error(storage_error(result.error))
    return result


Together = Callable[[Tx, list[tuple[Any, ...]]], list[outcome.Outcome[Any]]]


def runs_together(together: Together) -> Callable[[U], U]:
    """Mark a unit of work whose calls that meet in one group-commit batch may run as one
    set-based call: `together(tx, [args, ...])` gives each call's outcome, exactly as if each
    had run alone in turn (a refusal is an Error outcome and writes nothing). Such a unit
    must not read its caller's context variables: the calls run together, in none of them."""

    def mark(unit: U) -> U:
        unit.together = together  # type: ignore[attr-defined]
        return unit

    return mark


def pipelining(unit: U) -> U:
    """Mark a write unit that, alone in its batch, runs as one pipeline on PostgreSQL: its
    statements whose results it does not read (`Tx.run`, `Tx.execute_many`), its BEGIN and
    its COMMIT go with the next statement it reads or with the pipeline's last sync (the
    delivery's outcome write: ~10 round trips were most of its ~3.5 ms under load; 2 now:
    its recipients' UPDATE and the end). In a batch with others it runs as they do: after a
    failed pipeline psycopg may count as prepared a statement the server skipped, and the
    units after it would fail on it (alone, the connection is replaced instead). Such a unit
    does not COPY (`Tx.write_octets`)."""
    unit.pipelined = True  # type: ignore[attr-defined]
    return unit


def pipelined(unit: Unit) -> bool:
    return getattr(unit, "pipelined", False)


def in_one_snapshot(unit: U) -> U:
    """Mark a read unit of several statements that must agree (an email with its events): on
    PostgreSQL it runs in one REPEATABLE READ snapshot, where other reads take a snapshot per
    statement. SQLite reads a whole batch in one snapshot anyway."""
    unit.one_snapshot = True  # type: ignore[attr-defined]
    return unit


def _in_savepoint(
    tx: Tx,
    execute: Callable[[str], Any],
    in_transaction: Callable[[], bool],
    work: Callable[[], outcome.Outcome[Any]],
) -> outcome.Outcome[Any]:
    """`work` in a savepoint of the open transaction, undone if it fails."""
    execute("SAVEPOINT unit")
    tx.notes = set()
    result = work()
    if isinstance(result, outcome.Error):
        if _conflicted(result.error):
            # A deadlock victim: the locks the batch's earlier units hold may be what the
            # other transaction waits for, so the whole batch is undone and run again.
            raise result.error
        if not in_transaction():
            # SQLite undid the whole transaction itself (SQLITE_FULL does): the units
            # before this one are gone too, so the batch fails as a whole.
            raise result.error
        execute("ROLLBACK TO SAVEPOINT unit")
    execute("RELEASE SAVEPOINT unit")
    return result


def _run_isolated(
    tx: Tx, execute: Callable[[str], Any], in_transaction: Callable[[], bool], jobs: Sequence[Job]
) -> tuple[list[outcome.Outcome[Any]], set[str]]:
    """Run jobs inside an open transaction, each in its own savepoint, or, for a unit that
    `runs_together`, all its calls in one; their results, and the topics the units that
    succeeded announced. A joint call that fails as a whole (not a refusal: an error) runs
    each of its calls alone, so the one at fault fails alone."""
    results: list[outcome.Outcome[Any] | None] = [None] * len(jobs)
    notes: set[str] = set()
    alone: list[int] = []
    groups: dict[Together, list[int]] = {}
    for i, (unit, _) in enumerate(jobs):
        together = getattr(unit, "together", None)
        (alone if together is None else groups.setdefault(together, [])).append(i)
    for together, members in groups.items():
        if len(members) == 1:
            alone += members
            continue
        calls = [jobs[i][1] for i in members]
        joint = _in_savepoint(
            tx, execute, in_transaction, partial(_capture, together, tx, (calls,))
        )
        if isinstance(joint, outcome.Error):
            alone += members
            continue
        notes |= tx.notes
        for i, result in zip(members, joint.unwrap(), strict=True):
            results[i] = result
    for i in sorted(alone):
        unit, args = jobs[i]
        result = _in_savepoint(tx, execute, in_transaction, partial(_capture, unit, tx, args))
        if isinstance(result, outcome.Value):
            notes |= tx.notes
        results[i] = result
    done = [result for result in results if result is not None]
    assert len(done) == len(jobs)
    return done, notes


def _conflicted(exc: BaseException) -> bool:
    """Whether PostgreSQL undid the work to resolve a conflict with another transaction (a
    deadlock, a serialization failure): the same work, run again, succeeds."""
    import psycopg

    return isinstance(exc, psycopg.Error) and exc.sqlstate in _CONFLICTS


def _with_notes(unit: Unit, tx: Tx, args: tuple[Any, ...]) -> tuple[Any, set[str]]:
    """A unit run as a transaction of its own: its result and the topics it announced."""
    return unit(tx, *args), tx.notes


def _postgres_in_transaction(conn: Any) -> bool:
    """Whether the connection is still in a transaction (a failed one stays open until rolled
    back; only a lost connection ends it)."""
    from psycopg.pq import TransactionStatus

    return bool(conn.info.transaction_status != TransactionStatus.IDLE)


class SQLiteEngine:
    """The embedded default: one writer connection, a few reader connections, WAL."""

    dialect: Dialect = "sqlite"

    def __init__(self, path: str, readers: int = 4) -> None:
        if path != ":memory:":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        self._path = path
        self.sealer = NO_MASTER_KEY
        self.space = SpaceWatch()
        self.notes = Notes()
        self.node = ""
        self._writer = self._connect()
        self._writer.execute(_SIGNALS_TABLE)
        self.reader_slots = readers
        self.writer_slots = 1
        self._readers: queue.SimpleQueue[sqlite3.Connection] = queue.SimpleQueue()
        for _ in range(readers):
            self._readers.put(self._connect())
        self._write_lock = threading.Lock()
        # The processes of `serve --workers N` share the file. SQLite makes a writer that finds
        # the file locked sleep and try again (1 ms, then longer, up to 100 ms a time), which
        # put 0.5 s into the p99 of two workers; waiting on a lock file instead, each writer
        # wakes as soon as the one before commits.
        self._writers_file = (
            None if path == ":memory:" else os.open(f"{path}-writer", os.O_RDWR | os.O_CREAT, 0o600)
        )
        self._listener: sqlite3.Connection | None = None  # polls `_signals`, opened by `hear`
        self._heard_up_to = 0

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self._path, isolation_level=None, check_same_thread=False, timeout=10.0
        )
        conn.row_factory = sqlite3.Row
        # WAL lets readers run beside the writer; FULL makes a commit survive power loss.
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute("PRAGMA foreign_keys=ON")
        # Deleted and overwritten content is zeroed, not left in free space where a rewrite
        # (an erasure) would not reach it. Debian's SQLite is built with it on; others not.
        conn.execute("PRAGMA secure_delete=ON")
        return conn

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        if len(jobs) == 1:
            return [outcome.capture(self.transaction, *jobs[0])]
        (results, notes), stored = self._in_write_transaction(
            lambda conn, tx: self._signalled(
                conn, _run_isolated(tx, conn.execute, lambda: conn.in_transaction, jobs)
            )
        )
        self.notes.add(notes)
        self.space.settle(results, stored)
        return results

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any:
        (result, notes), stored = self._in_write_transaction(
            lambda conn, tx: self._signalled(conn, _with_notes(unit, tx, args))
        )
        self.notes.add(notes)
        self.space.settle([], stored)
        return result

    def _in_write_transaction(self, body: Callable[[sqlite3.Connection, Tx], T]) -> tuple[T, bool]:
        """`body` in one transaction of the writer: its result, and whether it stored new rows."""
        with self._write_lock, self._other_processes_wait(), self.space.refusals():
            conn = self._writer
            tx = Tx(conn, "sqlite", self.sealer)
            conn.execute("BEGIN IMMEDIATE")
            try:
                result = body(conn, tx)
                conn.execute("COMMIT")
            except BaseException:
                # SQLite may have rolled the transaction back itself (SQLITE_FULL does): a
                # second ROLLBACK would fail ("no transaction is active") and hide the error.
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
            return result, tx.inserted

    @contextmanager
    def _other_processes_wait(self) -> Iterator[None]:
        """Hold the file's write turn among this host's processes (blocking this thread)."""
        if self._writers_file is None:
            yield
            return
        fcntl.flock(self._writers_file, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(self._writers_file, fcntl.LOCK_UN)

    def _signalled(self, conn: sqlite3.Connection, done: tuple[T, set[str]]) -> tuple[T, set[str]]:
        """Tell the other processes on this file, at commit, what the transaction made."""
        shared = sorted(done[1])
        if shared:
            cursor = conn.execute(
                "INSERT INTO _signals (node, topics) VALUES (?, ?)", (self.node, "\n".join(shared))
            )
            seq = cursor.lastrowid or 0
            if seq % _SIGNALS_KEPT == 0:  # trimmed now and then, not at every commit
                conn.execute("DELETE FROM _signals WHERE seq < ?", (seq - _SIGNALS_KEPT,))
        return done

    def hear(self, timeout: float) -> set[str] | None:
        heard: set[str] = set()
        if self._listener is None:
            self._listener = self._connect()
            self._heard_up_to = int(
                self._listener.execute("SELECT COALESCE(MAX(seq), 0) FROM _signals").fetchone()[0]
            )
            heard.add("rescan")  # what was signalled before this process listened
        rows = self._listener.execute(
            "SELECT seq, node, topics FROM _signals WHERE seq > ? ORDER BY seq",
            (self._heard_up_to,),
        ).fetchall()
        for seq, node, topics in rows:
            self._heard_up_to = seq
            if node != self.node:
                heard.update(topics.split("\n"))
        if not rows:
            time.sleep(min(timeout, _SIGNALS_POLL))  # polled: SQLite has no channel to wait on
        return heard

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        conn = self._readers.get()
        try:
            # One snapshot for the whole batch; a failed read leaves nothing to undo.
            conn.execute("BEGIN")
            try:
                tx = Tx(conn, "sqlite", self.sealer)
                return [_capture(unit, tx, args) for unit, args in jobs]
            finally:
                if conn.in_transaction:  # a read that hit SQLITE_FULL (temp space) ended it
                    conn.execute("COMMIT")
        finally:
            self._readers.put(conn)

    def checkpoint(self) -> None:
        with self._write_lock, self._other_processes_wait():
            self._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()

    def probe(self, renew: bool) -> None:
        conn = sqlite3.connect(self._path, timeout=PROBE_CONNECT_TIMEOUT)
        try:
            conn.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
        finally:
            conn.close()

    def close(self) -> None:
        if self._writers_file is not None:
            os.close(self._writers_file)
            self._writers_file = None
        if self._listener is not None:
            self._listener.close()
        self._writer.close()
        while not self._readers.empty():
            self._readers.get().close()


class PostgresEngine:
    """PostgreSQL through psycopg 3 and a psycopg_pool connection pool."""

    dialect: Dialect = "postgresql"
    # Two write transactions at once: a commit's round trips and the server's fsync then
    # overlap the next batch's work. Units that check a total before adding to it lock what
    # they count in first, as they must across nodes anyway (storage/emails.py
    # `sent_in_month`).
    WRITERS = 2

    def __init__(self, url: str, pool_size: int = 8) -> None:
        self.writer_slots = self.WRITERS
        self.reader_slots = pool_size - self.WRITERS
        self.sealer = NO_MASTER_KEY
        self.space = SpaceWatch()
        self.notes = Notes()
        self.node = ""
        self._url = url
        self._listener: Any = None  # the connection that LISTENs, opened by the first `hear`
        self._pool_size = pool_size
        self._pool = self._new_pool(10.0)
        self._require_utf8()

    def _require_utf8(self) -> None:
        """Refuse a database whose text is not UTF-8 (SQL_ASCII, from an initdb without a
        locale): psycopg hands its text back as bytes, and Postroom stores UTF-8 text."""
        import psycopg

        with self._pool.connection() as conn:
            encoding = conn.execute("SHOW server_encoding").fetchone()["server_encoding"]
        if encoding != "UTF8":
            self._pool.close()
            raise psycopg.NotSupportedError(
                f"the database's encoding is {encoding}, and Postroom needs UTF8: create the"
                " database with ENCODING 'UTF8' (or the cluster with initdb --encoding=UTF8)"
            )

    def _new_pool(self, timeout: float) -> Any:
        from psycopg.rows import dict_row
        from psycopg_pool import ConnectionPool

        pool: ConnectionPool[Any] = ConnectionPool(
            self._url,
            min_size=2,
            max_size=self._pool_size,
            kwargs={"row_factory": dict_row, "autocommit": False, **_CONNECTION_LIMITS},
            # Work waits this long for a connection, at most: the pool is as large as the work
            # handed to it at once, so a longer wait means the database is not answering.
            timeout=POOL_WAIT,
            open=False,
        )
        pool.open(wait=True, timeout=timeout)
        return pool

    def write_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        if len(jobs) == 1:
            return [outcome.capture(self.transaction, *jobs[0])]
        (results, notes), stored = self._in_write_transaction(
            lambda conn, tx: self._announced(
                conn, _run_isolated(tx, conn.execute, lambda: _postgres_in_transaction(conn), jobs)
            )
        )
        self.notes.add(notes)
        self.space.settle(results, stored)
        return results

    def transaction(self, unit: Unit, args: tuple[Any, ...]) -> Any:
        (result, notes), stored = self._in_write_transaction(
            lambda conn, tx: self._announced(conn, _with_notes(unit, tx, args)), pipelined(unit)
        )
        self.notes.add(notes)
        self.space.settle([], stored)
        return result

    def _announced(self, conn: Any, done: tuple[T, set[str]]) -> tuple[T, set[str]]:
        """Tell every node, at commit, about the topics of the transaction's work."""
        for payload in notify_payloads(self.node, done[1]):
            conn.execute("SELECT pg_notify(%s, %s)", (NOTIFY_CHANNEL, payload))
        return done

    def _in_write_transaction(
        self, body: Callable[[Any, Tx], T], pipeline: bool = False
    ) -> tuple[T, bool]:
        """`body` in one transaction: its result, and whether it stored new rows. In a
        `pipeline`, BEGIN and COMMIT go with the statements around them."""
        attempt = 1
        while True:
            try:
                with self.space.refusals(), self._pool.connection() as conn:
                    tx = None
                    try:
                        if pipeline:
                            # BEGIN and COMMIT as statements of the pipeline, the connection
                            # autocommit meanwhile: psycopg's own BEGIN waits for its reply,
                            # its COMMIT syncs before the pipeline's exit syncs again (two
                            # round trips of their own), and `conn.transaction()` nests
                            # pipelines that sync at entry and exit. So the unit waits on
                            # the server only for what it reads, and once at the end. A
                            # failure closes the connection below.
                            conn.autocommit = True
                            with conn.pipeline() as pipe:
                                conn.execute("BEGIN")
                                tx = Tx(conn, "postgresql", self.sealer, pipe)
                                done = body(conn, tx), tx.inserted
                                conn.execute("COMMIT")
                            conn.autocommit = False
                        else:
                            with conn.transaction():
                                tx = Tx(conn, "postgresql", self.sealer, None)
                                done = body(conn, tx), tx.inserted
                    except BaseException:
                        # Failed in a pipeline (the transaction's own, or one the unit opened):
                        # psycopg's prepared statements may not be the server's (Tx.spoiled).
                        if pipeline or (tx is not None and tx.spoiled):
                            conn.close()
                        raise
                    if tx.large or tx.spoiled:
                        # Its buffers grew to a value's size, or a pipeline failed in it (a unit
                        # of the batch that failed alone): the pool replaces it.
                        conn.close()
                    return done
            except Exception as exc:
                if not _conflicted(exc) or attempt == CONFLICT_ATTEMPTS:
                    raise
                # Nodes claiming slots and rows of several destinations in one batch can
                # deadlock; a short, random pause keeps the next attempts from meeting again.
                time.sleep(random.uniform(0, 0.01 * attempt))
                attempt += 1

    def hear(self, timeout: float) -> set[str] | None:
        import psycopg

        heard: set[str] = set()
        if self._listener is None:
            listener = psycopg.connect(self._url, autocommit=True, **_CONNECTION_LIMITS)
            try:
                listener.execute(f"LISTEN {NOTIFY_CHANNEL}")
            except BaseException:
                listener.close()
                raise
            self._listener = listener
            heard.add("rescan")  # what was announced while nobody listened is looked for anew
        try:
            notices = list(self._listener.notifies(timeout=timeout, stop_after=1))
            if notices:  # and what else has arrived meanwhile
                notices += self._listener.notifies(timeout=0.01)
        except BaseException:
            self._listener.close()
            self._listener = None  # reconnect at the next call
            raise
        for notice in notices:
            node, _, topics = notice.payload.partition("\n")
            if node != self.node:
                heard.update(topics.splitlines())
        return heard

    def read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]]:
        results = self._read_batch(jobs)
        if results is None:  # the connection was lost (the server restarted, or dropped it)
            self._pool.check()  # and so, likely, were the others: the pool replaces them
            results = self._read_batch(jobs)  # reads are safe to run again, once
        if results is None:
            import psycopg

            raise psycopg.OperationalError("the connection to PostgreSQL was lost twice")
        return results

    def _read_batch(self, jobs: Sequence[Job]) -> list[outcome.Outcome[Any]] | None:
        """The batch's results, or None when the connection broke under it (the pool then
        discards it)."""
        with self._pool.connection() as conn:
            # No transaction around reads: under READ COMMITTED each statement sees its own
            # snapshot anyway, and BEGIN and COMMIT were two round trips per batch.
            conn.autocommit = True
            try:
                tx = Tx(conn, "postgresql", self.sealer)
                results: list[outcome.Outcome[Any]] = []
                for unit, args in jobs:
                    if getattr(unit, "one_snapshot", False):
                        result = self._in_snapshot(conn, tx, unit, args)
                    else:
                        result = _capture(unit, tx, args)
                    if isinstance(result, outcome.Error) and conn.broken:
                        return None
                    results.append(result)
                return results
            finally:
                if tx.large:
                    conn.close()  # its buffers grew to the value's size: the pool replaces it
                elif not conn.broken:
                    conn.autocommit = False  # as the pool's other users expect it

    @staticmethod
    def _in_snapshot(conn: Any, tx: Tx, unit: Unit, args: tuple[Any, ...]) -> outcome.Outcome[Any]:
        conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        try:
            return _capture(unit, tx, args)
        finally:
            if not conn.broken:
                conn.execute("ROLLBACK")  # read only: nothing to keep

    def checkpoint(self) -> None:
        return  # the server's files and its write-ahead log are PostgreSQL's to manage

    def probe(self, renew: bool) -> None:
        import psycopg

        with psycopg.connect(self._url, autocommit=True, **_CONNECTION_LIMITS) as conn:
            conn.execute("SELECT 1")
        if not renew:  # a dropped connection or two: replaced now, not by failed work
            self._pool.check()
            return
        # Back from an outage: the pool's attempts to reconnect have backed off (by up to
        # half a minute at a time), so a pool of fresh connections replaces it; work still
        # waiting on the old one fails as an outage and is tried again by its caller.
        fresh = self._new_pool(POOL_WAIT)
        old, self._pool = self._pool, fresh
        old.close(timeout=0)

    def close(self) -> None:
        if self._listener is not None:
            self._listener.close()
        self._pool.close()


def open_engine(url: str) -> StorageEngine:
    """Open the engine a database URL names; ValueError for an unknown scheme."""
    if url.startswith("sqlite:///"):
        return SQLiteEngine(os.path.expanduser(url.removeprefix("sqlite:///")))
    if url.startswith(("postgresql://", "postgres://")):
        return PostgresEngine(url)
    raise ValueError("must start with sqlite:/// or postgresql://")
