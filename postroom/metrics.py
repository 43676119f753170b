"""Prometheus metrics read from the actors' `statistics()` snapshots at scrape time.

Nothing on a hot path touches a metric object: each scrape asks the actors for a frozen
snapshot, so measuring costs nothing between scrapes.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from storage.database import Database


class ServiceCollector(Collector):
    def __init__(self, db: Database) -> None:
        self._db = db

    def collect(self) -> Iterator[Metric]:
        writer = self._db.writer_statistics()
        yield CounterMetricFamily(
            "postroom_commit_batches", "Group-commit transactions written", value=writer.batches
        )
        yield CounterMetricFamily(
            "postroom_commit_units", "Units of work committed by group commit", value=writer.units
        )
        yield GaugeMetricFamily(
            "postroom_commit_largest_batch",
            "Largest group-commit batch",
            value=writer.largest_batch,
        )
        yield GaugeMetricFamily(
            "postroom_commit_waiting", "Units waiting for the writer", value=writer.waiting
        )


def build_registry(db: Database) -> CollectorRegistry:
    """A registry of its own per service, so several services can share one process."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ServiceCollector(db))
    return registry
