"""How long accepted mail takes to reach its recipients, as histogram buckets for `/metrics`.

Counting into a fixed list of buckets is a bisect and an increment per delivered recipient;
the snapshot is plain data, so the engine needs no metrics library and a scrape reads it like
any other actor statistic.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

# Upper bounds in seconds, from a local sink (milliseconds) to the retry schedule (hours).
BOUNDS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 14400.0)


@dataclass(frozen=True, slots=True)
class LatencySnapshot:
    bounds: tuple[float, ...]
    counts: tuple[int, ...]  # per bucket, not cumulative; the last one is above every bound
    total_seconds: float


class LatencyHistogram:
    def __init__(self) -> None:
        self._counts = [0] * (len(BOUNDS) + 1)
        self._total = 0.0

    def observe(self, seconds: float) -> None:
        # bisect_left: a value equal to a bound belongs to that bound's bucket (Prometheus `le`).
        self._counts[bisect_left(BOUNDS, seconds)] += 1
        self._total += seconds

    def snapshot(self) -> LatencySnapshot:
        return LatencySnapshot(BOUNDS, tuple(self._counts), self._total)
