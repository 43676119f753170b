"""Storage's own errors: what a driver's exception means for the caller, whatever the engine.

The engines translate at their edge (httpcore's `map_exceptions`): a full disk is SQLite's
SQLITE_FULL or an ENOSPC, or PostgreSQL's disk_full (SQLSTATE 53100); above storage it is
always `StorageFull`. Everything else passes through unchanged.

`is_outage` tells a database that is unavailable (down, unreachable, full) from a unit of work
that was wrong: an outage says nothing about the row being worked, so actors never count it
against an item (engine/platform/faults.py) and the supervisor waits it out. `DatabaseUnreachable` is
the one storage raises itself, at once, while it knows the database is gone
(storage/reachability.py).
"""

from __future__ import annotations

import errno
import sqlite3

import psycopg
import psycopg_pool

DISK_FULL_SQLSTATE = "53100"


class StorageFull(Exception):
    """Raised when the database has no room for a write (the disk, or SQLite's
    `max_page_count`, is full). Nothing of the refused unit of work was stored: the caller
    may try again once space returns. `reason` names the driver's error, without its text
    (which may carry file paths)."""

    def __init__(self, reason: str) -> None:
        super().__init__(f"no space left for the database ({reason})")
        self.reason = reason


class DatabaseUnreachable(Exception):
    """Raised at once, without trying, for work handed to storage while the database is known
    to be unreachable (the last probe found it gone): nothing was done, the caller may try
    again once a probe finds it back."""

    def __init__(self, down_for: float) -> None:
        super().__init__(f"the database has not answered for {down_for:.0f} s")
        self.down_for = down_for


def storage_error(exc: BaseException) -> BaseException:
    """The error `exc` stands for above storage: a `StorageFull` (caused by `exc`) for a full
    disk, else `exc` itself."""
    # Errors the sqlite3 module raises itself (a closed connection) carry no SQLite code.
    code = getattr(exc, "sqlite_errorcode", None) if isinstance(exc, sqlite3.Error) else None
    if code is not None and code & 0xFF == sqlite3.SQLITE_FULL:
        reason = "SQLITE_FULL"
    elif isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        reason = "ENOSPC"
    elif getattr(exc, "sqlstate", None) == DISK_FULL_SQLSTATE:  # psycopg.errors.DiskFull
        reason = f"disk_full, SQLSTATE {DISK_FULL_SQLSTATE}"
    else:
        return exc
    full = StorageFull(reason)
    full.__cause__ = exc
    return full


def is_outage(exc: BaseException) -> bool:
    """Whether `exc` says the database is unavailable rather than the work wrong."""
    if isinstance(exc, BaseExceptionGroup):
        return any(is_outage(inner) for inner in exc.exceptions)
    return isinstance(
        exc,
        StorageFull
        | DatabaseUnreachable
        | sqlite3.OperationalError
        | psycopg.OperationalError
        | psycopg.InterfaceError
        | psycopg_pool.PoolTimeout,
    )
