"""Medians of benchmark runs: every figure is the median of several runs, never one run."""

from __future__ import annotations

import statistics
from typing import Any


def median_run(runs: list[dict[str, Any]], key: str = "rate") -> dict[str, Any]:
    """The run with the median `key` (its latencies belong to it), plus every run's figure."""
    ordered = sorted(runs, key=lambda run: float(run[key]))
    chosen = dict(ordered[len(ordered) // 2])
    chosen["runs"] = ", ".join(f"{float(run[key]):.0f}" for run in runs)
    return chosen


def median(values: list[float]) -> float:
    return statistics.median(values) if values else 0.0
