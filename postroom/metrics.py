"""Prometheus metrics read from the actors' `statistics()` snapshots at scrape time.

Nothing on a hot path touches a metric object: each scrape asks the actors for a frozen
snapshot, so measuring costs nothing between scrapes.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.supervisor import Supervisor
from storage.database import Database


class ServiceCollector(Collector):
    def __init__(self, db: Database, supervisor: Supervisor) -> None:
        self._db = db
        self._supervisor = supervisor

    def collect(self) -> Iterator[Metric]:
        for role, stats in (
            ("write", self._db.writer_statistics()),
            ("read", self._db.reader_statistics()),
        ):
            yield CounterMetricFamily(
                f"postroom_db_{role}_batches",
                f"Database {role} batches (one thread hop each)",
                value=stats.batches,
            )
            yield CounterMetricFamily(
                f"postroom_db_{role}_units",
                f"Units of work in database {role} batches",
                value=stats.units,
            )
            yield GaugeMetricFamily(
                f"postroom_db_{role}_largest_batch",
                f"Largest database {role} batch",
                value=stats.largest_batch,
            )
            yield GaugeMetricFamily(
                f"postroom_db_{role}_waiting",
                f"Units waiting for a database {role} batch",
                value=stats.waiting,
            )
        for actor, snapshot in self._supervisor.statistics().items():
            for field in dataclasses.fields(snapshot):
                yield GaugeMetricFamily(
                    f"postroom_{actor}_{field.name}",
                    f"{actor}: {field.name}",
                    value=getattr(snapshot, field.name),
                )


def build_registry(db: Database, supervisor: Supervisor) -> CollectorRegistry:
    """A registry of its own per service, so several services can share one process."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(ServiceCollector(db, supervisor))
    return registry
