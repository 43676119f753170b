"""The one source of time for engine code.

Wall-clock time is anchored to Trio's clock when the service starts, so `now()` and sleeping
until a deadline move together: under `trio.testing.MockClock` a 24-hour window passes in
milliseconds through the same code path as production. Engine code never calls `time.time()`
or `datetime.now()`.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import trio


class Clock:
    """Wall time derived from Trio's clock; create it inside `trio.run`."""

    __slots__ = ("_trio_anchor", "_wall_anchor")

    def __init__(self, wall_anchor: datetime | None = None) -> None:
        self._wall_anchor = wall_anchor or datetime.now(UTC)
        self._trio_anchor = trio.current_time()

    def now(self) -> datetime:
        """The current UTC time."""
        elapsed = trio.current_time() - self._trio_anchor
        return self._wall_anchor + timedelta(seconds=elapsed)

    def deadline_for(self, when: datetime) -> float:
        """The Trio clock value at which wall time `when` arrives."""
        return self._trio_anchor + (when - self._wall_anchor).total_seconds()

    async def sleep_until(self, when: datetime) -> None:
        """Sleep until wall time `when` (returns at once if it has passed)."""
        await trio.sleep_until(self.deadline_for(when))
