"""One transaction's view of a connection, the same on both engines.

SQL is written once with `:name` parameters; on PostgreSQL it is rewritten to psycopg's
`%(name)s` style (cached per statement). Rows come back as plain dicts.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    from storage.sealing import Sealer

Row = dict[str, Any]
Params = Mapping[str, Any]
Dialect = Literal["sqlite", "postgresql"]

# Octets bound as one parameter at most, on SQLite; larger values are written in pieces.
_INLINE_OCTETS = 1024 * 1024
# PostgreSQL's binary COPY: its signature, no flags, no header extension (then the tuples).
_PGCOPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_NAMED_PARAM = re.compile(r"(?<![:\w]):([A-Za-z_]\w*)")


@lru_cache(maxsize=1024)
def to_pyformat(sql: str) -> str:
    """Rewrite `:name` parameters as `%(name)s`, escaping literal percent signs."""
    return _NAMED_PARAM.sub(r"%(\1)s", sql.replace("%", "%%"))


class Cursor(Protocol):
    rowcount: int

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...


class Connection(Protocol):
    def execute(self, sql: str, params: Any = ..., /) -> Any: ...


@lru_cache(maxsize=1024)  # the statements are the code's own constants
def _inserts(sql: str) -> bool:
    """Whether a statement stores new rows: an INSERT, but no upsert (`ON CONFLICT`), which
    mostly renews a row in place (a lease, a counter) and so proves no room."""
    return sql.lstrip()[:6].upper() == "INSERT" and "ON CONFLICT" not in sql.upper()


class Tx:
    """Runs statements inside the current transaction of one connection."""

    __slots__ = ("_conn", "_pipe", "dialect", "inserted", "large", "notes", "sealer", "spoiled")

    def __init__(self, conn: Any, dialect: Dialect, sealer: Sealer, pipe: Any = None) -> None:
        self._conn = conn
        self._pipe = pipe  # psycopg's pipeline while one is open (see `pipeline`)
        # Whether a pipeline failed: psycopg may then count as prepared a statement the server
        # skipped (it fails later, once, with "prepared statement does not exist").
        self.spoiled = False
        self.dialect: Dialect = dialect
        self.sealer = sealer  # seals and unseals secrets at rest (storage.sealing)
        self.notes: set[str] = set()  # topics of new work, announced once committed
        # Whether the unit stored new rows: what proves a full database has room again (an
        # UPDATE, such as a heartbeat, can fit in place while every insert is refused).
        self.inserted = False
        # Whether the unit moved a value over _INLINE_OCTETS: libpq keeps its buffers as
        # large as the largest message it carried, so the engine then closes the connection
        # rather than keep that memory in the pool.
        self.large = False

    def notify(self, topic: str) -> None:
        """Announce, once this unit of work is committed, that it made work of `topic`
        (`mail:<domain>`, `webhooks`, …) for the actors of every node (engine/platform/wakeups.py)."""
        self.notes.add(topic)

    @contextmanager
    def pipeline(self) -> Iterator[None]:
        """Statements whose results nobody reads meanwhile (`run`, `execute_many`) go to
        PostgreSQL together with the next one whose result is read, one round trip instead of
        one each (psycopg's pipeline mode; errors surface by the end of the block at the
        latest); on SQLite, in process, each runs as it comes. No COPY (`write_octets`)
        inside."""
        if self.dialect != "postgresql" or self._pipe is not None:
            yield
            return
        try:
            with self._conn.pipeline() as pipe:
                self._pipe = pipe
                try:
                    yield
                finally:
                    self._pipe = None
        except BaseException:
            self.spoiled = True
            raise

    def inline_octets(self, data: bytes) -> bool:
        """Whether `data` may be bound as a parameter; if not, store a placeholder (an empty
        value) and then `write_octets`. On SQLite a bound value stays copied in the cached
        statement until it runs again; on PostgreSQL the driver copies a bound value twice
        (its own buffer, then libpq's): a 34 MiB message would be held three times."""
        small = len(data) <= _INLINE_OCTETS
        self.large = self.large or not small
        return small

    def octets(self, sql: str, params: Params) -> Row | None:
        """The first row of a query reading large values (bytes columns): fetched in binary
        on PostgreSQL (in text, bytea comes as hex, twice its size)."""
        if self.dialect == "sqlite":
            row = self._conn.execute(sql, params).fetchone()
        else:
            with self._conn.cursor(binary=True) as cursor:
                row = cursor.execute(self._sql(sql), params).fetchone()
        if row is None:
            return None
        found = dict(row)
        self.large = self.large or any(
            isinstance(v, bytes | memoryview) and len(v) > _INLINE_OCTETS for v in found.values()
        )
        return found

    def write_octets(self, table: str, column: str, key_column: str, key: str, data: bytes) -> None:
        """Set `column` of the row whose `key_column` is `key` to `data`, in pieces: on SQLite
        by incremental blob I/O (nothing stays bound), on PostgreSQL by a binary COPY into a
        temporary table of this connection, which the row then takes its value from (the
        driver never holds more than a piece). The names are the code's own."""
        view = memoryview(data)
        if self.dialect != "sqlite":
            self.execute(
                "CREATE TEMPORARY TABLE IF NOT EXISTS postroom_octets (data bytea)"
                " ON COMMIT DELETE ROWS"
            )
            with self._conn.cursor() as cursor:
                copy_sql = "COPY postroom_octets (data) FROM STDIN (FORMAT BINARY)"
                with cursor.copy(copy_sql) as copy:
                    copy.write(_PGCOPY_HEADER + struct.pack("!hi", 1, len(data)))
                    for start in range(0, len(data), _INLINE_OCTETS):
                        copy.write(view[start : start + _INLINE_OCTETS])
                    copy.write(struct.pack("!h", -1))
            self.execute(
                f"UPDATE {table} SET {column} = (SELECT data FROM postroom_octets)"
                f" WHERE {key_column} = :key",
                {"key": key},
            )
            self.execute("DELETE FROM postroom_octets")
            return
        self._conn.execute(
            f"UPDATE {table} SET {column} = zeroblob(?) WHERE {key_column} = ?", (len(data), key)
        )
        rowid = self._conn.execute(
            f"SELECT rowid FROM {table} WHERE {key_column} = ?", (key,)
        ).fetchone()[0]
        with self._conn.blobopen(table, column, rowid) as blob:
            for start in range(0, len(data), _INLINE_OCTETS):
                blob.write(view[start : start + _INLINE_OCTETS])

    def row_lock(self, clause: str = "FOR UPDATE", *, when: bool = True) -> str:
        """` <clause>` to append to a query on PostgreSQL (when `when`), where concurrent
        transactions need row locks; nothing on SQLite, whose single writer already holds
        the whole database for every write transaction."""
        return f" {clause}" if when and self.dialect == "postgresql" else ""

    def _sql(self, sql: str) -> str:
        return to_pyformat(sql) if self.dialect == "postgresql" else sql

    def execute(self, sql: str, params: Params | None = None) -> int:
        """Run a statement; the number of rows it touched (inside `pipeline`, once what was
        queued before it has run too: a round trip, where `run` takes none)."""
        cursor = self._conn.execute(self._sql(sql), params or {})
        if self._pipe is not None:
            self._pipe.sync()
        count = int(cursor.rowcount)
        if count > 0 and _inserts(sql):
            self.inserted = True
        return count

    def run(self, sql: str, params: Params | None = None) -> None:
        """Run a statement whose row count nobody reads: inside `pipeline`, on PostgreSQL,
        it goes to the server with the next statement whose result is read."""
        self._conn.execute(self._sql(sql), params or {})
        self.inserted = self.inserted or _inserts(sql)

    def execute_many(self, sql: str, rows: Iterable[Params]) -> None:
        """Run one statement for each parameter set, in one driver call."""
        rows = list(rows)
        if not rows:
            return
        if self.dialect == "postgresql":
            with self._conn.cursor() as cursor:
                cursor.executemany(self._sql(sql), rows)
        else:
            self._conn.executemany(sql, rows)
        self.inserted = self.inserted or _inserts(sql)

    def one(self, sql: str, params: Params | None = None) -> Row | None:
        """The first row of a query, or None."""
        row = self._conn.execute(self._sql(sql), params or {}).fetchone()
        if row is None:
            return None
        self.inserted = self.inserted or _inserts(sql)
        return dict(row)

    def all(self, sql: str, params: Params | None = None) -> list[Row]:
        """Every row of a query."""
        rows = [dict(row) for row in self._conn.execute(self._sql(sql), params or {}).fetchall()]
        self.inserted = self.inserted or bool(rows and _inserts(sql))
        return rows

    def value(self, sql: str, params: Params | None = None) -> Any:
        """The first column of the first row, or None."""
        row = self._conn.execute(self._sql(sql), params or {}).fetchone()
        if row is None:
            return None
        self.inserted = self.inserted or _inserts(sql)
        return next(iter(dict(row).values()))

    def later(self, sql: str, params: Params | None = None) -> Callable[[], list[Row]]:
        """A query the unit will read later, sent now: what it returns gives the rows. Inside
        `pipeline`, on PostgreSQL, the query goes to the server with the next statement
        whose result is read, so a read known ahead rides on that one's round trip (the
        outcome write's webhooks, read with its recipients' UPDATE); elsewhere it runs now.
        For reads only: nothing marks the unit `inserted`."""
        cursor = self._conn.execute(self._sql(sql), params or {})
        if self._pipe is None:
            rows = [dict(row) for row in cursor.fetchall()]
            return lambda: rows
        return lambda: [dict(row) for row in cursor.fetchall()]
