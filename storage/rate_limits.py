"""Rate limit counters shared by every node: one row per key, counting in a fixed window.

A key's window starts at its first attempt; once it has ended, the next attempt starts a new
one. Counting is a single upsert, so attempts arriving at the same time on several nodes are
each counted (the row lock orders them on PostgreSQL).
"""

from __future__ import annotations

from datetime import datetime

from storage.codec import parse_timestamp, timestamp
from storage.tx import Tx

# Ended windows removed per counted attempt: enough to keep up with any flood of new keys,
# few enough that no attempt pays for a large delete.
PRUNE_BATCH = 100


def count(tx: Tx, key: str, now: datetime, new_window_ends: datetime) -> tuple[int, datetime]:
    """Count one attempt under `key`: the attempts in its window so far, and when it ends.

    A key with no window, or one that has ended, gets a new window ending at
    `new_window_ends`.
    """
    row = tx.one(
        "INSERT INTO rate_limits (limit_key, attempts, window_ends) VALUES (:key, 1, :ends)"
        " ON CONFLICT (limit_key) DO UPDATE SET"
        " attempts = CASE WHEN rate_limits.window_ends <= :now THEN 1"
        " ELSE rate_limits.attempts + 1 END,"
        " window_ends = CASE WHEN rate_limits.window_ends <= :now THEN :ends"
        " ELSE rate_limits.window_ends END"
        " RETURNING attempts, window_ends",
        {"key": key, "now": timestamp(now), "ends": timestamp(new_window_ends)},
    )
    assert row is not None  # an upsert with RETURNING always answers one row
    return int(row["attempts"]), parse_timestamp(row["window_ends"])


def attempts(tx: Tx, key: str, now: datetime) -> int:
    """The attempts counted under `key` in its window (0 when it has none, or it ended)."""
    row = tx.one(
        "SELECT attempts FROM rate_limits WHERE limit_key = :key AND window_ends > :now",
        {"key": key, "now": timestamp(now)},
    )
    return 0 if row is None else int(row["attempts"])


def forget(tx: Tx, key: str) -> None:
    """Drop a key's count (its window starts afresh at its next attempt)."""
    tx.execute("DELETE FROM rate_limits WHERE limit_key = :key", {"key": key})


def prune(tx: Tx, now: datetime) -> None:
    """Remove up to PRUNE_BATCH keys whose window has ended."""
    # Rows another node is counting right now are skipped, not waited for: pruning never
    # blocks a caller and never takes part in a lock cycle.
    lock = tx.row_lock("FOR UPDATE SKIP LOCKED")
    tx.execute(
        "DELETE FROM rate_limits WHERE limit_key IN (SELECT limit_key FROM rate_limits"
        f" WHERE window_ends <= :now ORDER BY window_ends LIMIT {PRUNE_BATCH}{lock})",
        {"now": timestamp(now)},
    )
