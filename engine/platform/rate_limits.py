"""Rate limits held in the database, so every node shares them (storage/rate_limits.py).

A limit allows `attempts` per key within `window` of the key's first attempt. An attempt is
counted in the caller's unit of work before the limited work runs; over a limit, `RateLimited`
(429 with Retry-After) is raised inside that unit, so a refused attempt is rolled back and not
counted. Keys are counted in the order given: callers give one fixed order (one lock order on
every node).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.platform.errors import RateLimited
from storage import rate_limits
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Limit:
    """At most `attempts` per key within `window` of the key's first attempt."""

    prefix: str
    attempts: int
    window: timedelta

    def key(self, name: str) -> str:
        return f"{self.prefix}:{name}"


def count(tx: Tx, keyed: Sequence[tuple[Limit, str]], now: datetime, detail: str) -> None:
    """Count one attempt under each (limit, key); RateLimited when any limit is reached."""
    waits = []
    for limit, key in keyed:
        attempts, window_ends = rate_limits.count(tx, key, now, now + limit.window)
        if attempts > limit.attempts:
            waits.append((window_ends - now).total_seconds())
    if waits:
        raise RateLimited(detail, retry_after=max(1, math.ceil(max(waits))))
    rate_limits.prune(tx, now)


def forget(tx: Tx, key: str) -> None:
    """Drop a key's count: its window starts afresh at its next attempt."""
    rate_limits.forget(tx, key)
