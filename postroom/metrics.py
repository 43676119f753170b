"""Prometheus metrics: the actors' `statistics()` snapshots, the backlog, and two latencies.

Nothing on the engine's hot path touches a metric object: each scrape asks the actors for a
frozen snapshot (delivery outcomes, what each domain queue has in flight, the accept -> 250
histogram the router keeps as plain buckets) and counts the backlog in the database (one
indexed GROUP BY per table, read by the `/metrics` route before the registry renders, so the
scrape itself never blocks the event loop). Destinations are labelled with a fixed
vocabulary (engine/delivery/providers.py: the big mailbox providers, and `other`), never a
recipient domain: no tenant's mail can grow the label sets or show its recipients' names. The API's accept latency, request to 202 on the
send and batch endpoints, is the one figure observed as it happens, by an ASGI wrapper
around the app.

The workers of one `postroom serve --workers N` share the API port, so a scrape reaches one
of them at random, and delivery workers have no port at all. Each worker therefore publishes
its process figures with its heartbeat (engine/platform/nodes.py, every 3 s), and a scrape adds up
its own figures, as of now, and the other live workers' of the same instance, as of their
last beat (`merged`): counters and histograms add up, and so do the gauges (connections
open, recipients in flight), except the few that say whether or how much at most
(`_AT_MOST`). The backlog is read from the database and is not added up.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import trio
from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from engine.delivery import providers
from engine.delivery.latency import LatencySnapshot
from engine.platform.runtime import Runtime
from engine.platform.supervisor import Supervisor
from storage import backlog, nodes
from storage.database import Database
from storage.tx import Tx

# Request to 202, from a local commit (milliseconds) to an overloaded node (seconds).
ACCEPT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# POST paths whose 202 is timed, and the label each gets.
ACCEPT_PATHS = {"/v1/emails/": "send", "/v1/emails": "send", "/v1/emails/batch": "batch"}
BACKLOG_TIMEOUT = 5.0  # seconds; Prometheus' default scrape timeout is 10
# Gauges that several workers' figures make one of by the largest, not the sum.
_AT_MOST = frozenset(
    ("postroom_storage_full", "postroom_db_write_largest_batch", "postroom_db_read_largest_batch")
)

ASGIApp = Any  # (scope, receive, send) -> Awaitable[None]


class HasStatistics(Protocol):
    def statistics(self) -> Any: ...


def _numeric_fields(snapshot: Any) -> Iterator[tuple[str, float]]:
    for field in dataclasses.fields(snapshot):
        value = getattr(snapshot, field.name)
        if isinstance(value, int | float) and not isinstance(value, bool):
            yield field.name, value


def _histogram(name: str, doc: str, snapshot: LatencySnapshot) -> HistogramMetricFamily:
    buckets, running = [], 0
    for bound, count in zip(snapshot.bounds, snapshot.counts, strict=False):
        running += count
        buckets.append((repr(bound), running))
    buckets.append(("+Inf", running + snapshot.counts[-1]))
    return HistogramMetricFamily(name, doc, buckets=buckets, sum_value=snapshot.total_seconds)


def published(families: Iterable[Metric]) -> str:
    """Figures as a worker publishes them for the others (JSON)."""
    return json.dumps(
        [[family.name, family.type, family.documentation, _samples(family)] for family in families],
        separators=(",", ":"),
    )


def _samples(family: Metric) -> list[tuple[str, dict[str, str], float]]:
    # A `_created` sample is a time, not an amount: nothing to add up.
    return [(s.name, s.labels, s.value) for s in family.samples if not s.name.endswith("_created")]


def _read(figures: str) -> list[Metric]:
    """Another worker's published figures; none if they do not read as `published` writes
    them (a worker of another version), so that a scrape still answers."""
    families = []
    try:
        for name, kind, documentation, samples in json.loads(figures):
            family = Metric(name, documentation, kind)
            for sample, labels, value in samples:
                family.add_sample(sample, dict(labels), float(value))
            families.append(family)
    except (ValueError, TypeError, AttributeError):
        return []
    return families


def merged(workers: Iterable[Iterable[Metric]]) -> Iterator[Metric]:
    """The figures of several workers as one: each sample (name and labels) added up, or the
    largest taken for the gauges in `_AT_MOST`; families in the order first met."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], float]] = {}
    for figures in workers:
        for family in figures:
            if family.name not in families:
                families[family.name] = Metric(family.name, family.documentation, family.type)
                values[family.name] = {}
            into = values[family.name]
            for sample, labels, value in _samples(family):
                key = (sample, tuple(labels.items()))
                if key not in into:
                    into[key] = value
                elif family.name in _AT_MOST:
                    into[key] = max(into[key], value)
                else:
                    into[key] += value
    for name, family in families.items():
        for (sample, pairs), value in values[name].items():
            family.add_sample(sample, dict(pairs), value)
        yield family


def _by_provider(counts: Iterable[tuple[tuple[str, ...], int]]) -> dict[tuple[str, ...], int]:
    """Counts keyed by a destination (first) and other labels, added up per provider label
    (engine/delivery/providers.py), sorted: label sets no tenant's recipients can grow."""
    summed: dict[tuple[str, ...], int] = {}
    for (destination, *rest), count in counts:
        key = (providers.label(destination), *rest)
        summed[key] = summed.get(key, 0) + count
    return dict(sorted(summed.items()))


class ServiceCollector(Collector):
    def __init__(self, db: Database, supervisor: Supervisor, accept_latency: Histogram) -> None:
        self._db = db
        self._supervisor = supervisor
        self._accept_latency = accept_latency
        self.sources: dict[str, HasStatistics] = {}  # listeners and other non-actors
        # Refreshed before each scrape: the backlog, and the other workers' figures.
        self.backlog = backlog.Backlog({}, {}, {})
        self.others: list[str] = []

    def collect(self) -> Iterator[Metric]:
        yield from self._backlog()
        yield from merged([self.process(), *map(_read, self.others)])

    def process(self) -> list[Metric]:
        """This process's own figures: what it publishes, and what a scrape adds up."""
        families = [*self._database()]
        snapshots: dict[str, Any] = dict(self._supervisor.statistics())
        snapshots.update({name: source.statistics() for name, source in self.sources.items()})
        for actor, snapshot in snapshots.items():
            for name, value in _numeric_fields(snapshot):
                families.append(
                    GaugeMetricFamily(f"postroom_{actor}_{name}", f"{actor}: {name}", value=value)
                )
        families += self._faults()
        if "delivery" in snapshots:
            families += self._delivery(snapshots["delivery"])
        if "webhooks" in snapshots:
            families += self._webhooks(snapshots["webhooks"])
        families += self._accept_latency.collect()
        return families

    def _database(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(
            "postroom_storage_full",
            "1 while the database has no room for writes (refused with 507 and 452)",
            value=int(self._db.storage_full is not None),
        )
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

    def _backlog(self) -> Iterator[Metric]:
        depth = GaugeMetricFamily(
            "postroom_queue_depth",
            "Recipients waiting for delivery, by destination provider and status",
            labels=["destination", "status"],
        )
        for (destination, status), count in _by_provider(self.backlog.recipients.items()).items():
            depth.add_metric([destination, status], count)
        yield depth
        emails = GaugeMetricFamily(
            "postroom_emails_waiting", "Emails not yet done, by status", labels=["status"]
        )
        for status in backlog.WAITING_EMAIL:
            emails.add_metric([status], self.backlog.emails.get(status, 0))
        yield emails
        hooks = GaugeMetricFamily(
            "postroom_webhook_deliveries_waiting",
            "Webhook deliveries still to POST, by status",
            labels=["status"],
        )
        for status in backlog.WAITING_WEBHOOK:
            hooks.add_metric([status], self.backlog.webhook_deliveries.get(status, 0))
        yield hooks
        incidents = GaugeMetricFamily(
            "postroom_delivery_incidents_open",
            "Open destination incidents (sender-side blocks, rate limits), by destination"
            " provider and kind",
            labels=["destination", "kind"],
        )
        for (destination, kind), count in _by_provider(self.backlog.incidents.items()).items():
            incidents.add_metric([destination, kind], count)
        yield incidents

    def _faults(self) -> Iterator[Metric]:
        stats = self._supervisor.fault_statistics()
        for name, doc, counts in (
            ("postroom_actor_restarts", "Times an actor raised and was restarted", stats.restarts),
            ("postroom_work_faults", "Work items that made their actor raise", stats.faults),
            (
                "postroom_work_quarantined",
                "Work items quarantined after 3 faults",
                stats.quarantined,
            ),
        ):
            family = CounterMetricFamily(name, doc, labels=["actor"])
            for actor, count in sorted(counts.items()):
                family.add_metric([actor], count)
            yield family

    def _delivery(self, stats: Any) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "postroom_deliveries",
            "Recipient delivery attempts by outcome since start",
            labels=["outcome"],
        )
        for outcome in ("delivered", "deferred", "bounced", "failed"):
            outcomes.add_metric([outcome], getattr(stats, outcome))
        yield outcomes
        by_tls = CounterMetricFamily(
            "postroom_deliveries_tls",
            "Delivered recipients by the TLS policy applied and the TLS they got since start",
            labels=["policy", "tls"],
        )
        for policy, tls, count in stats.tls:
            by_tls.add_metric([policy, tls], count)
        yield by_tls
        in_flight = GaugeMetricFamily(
            "postroom_delivery_in_flight",
            "Recipients being delivered now, by destination provider",
            labels=["destination"],
        )
        flying = _by_provider(((q.domain,), q.in_flight) for q in stats.domains)
        for (destination,), count in flying.items():
            in_flight.add_metric([destination], count)
        yield in_flight
        if stats.delivery_latency is not None:
            yield _histogram(
                "postroom_delivery_latency_seconds",
                "Accept to the recipient's 250, per delivered recipient",
                stats.delivery_latency,
            )

    def _webhooks(self, stats: Any) -> Iterator[Metric]:
        outcomes = CounterMetricFamily(
            "postroom_webhook_deliveries",
            "Webhook POST attempts by outcome since start",
            labels=["outcome"],
        )
        outcomes.add_metric(["delivered"], stats.delivered)
        outcomes.add_metric(["retrying"], stats.failed_attempts - stats.dead)
        outcomes.add_metric(["dead"], stats.dead)
        yield outcomes


class ServiceMetrics:
    """Everything `/metrics` serves for one service, in a registry of its own (so several
    services can share one process, as the tests do); `instance` names the workers of one
    `serve --workers N` whose figures it adds up (None: this process alone)."""

    def __init__(self, rt: Runtime, supervisor: Supervisor, instance: str | None) -> None:
        self._db = rt.db
        self._node = rt.node
        self._instance = instance
        self.registry = CollectorRegistry(auto_describe=True)
        # Observed here; collected (and added up) with the other figures of the process.
        self.accept_latency = Histogram(
            "postroom_api_accept_seconds",
            "Request to 202 on the send and batch endpoints",
            ["endpoint"],
            buckets=ACCEPT_BUCKETS,
            registry=None,
        )
        self._collector = ServiceCollector(rt.db, supervisor, self.accept_latency)
        self.registry.register(self._collector)

    def add_source(self, name: str, source: HasStatistics) -> None:
        """Report `source.statistics()` (a frozen dataclass) as `postroom_<name>_<field>`."""
        self._collector.sources[name] = source

    def published(self) -> str:
        """This process's figures, for the other workers' scrapes (published by each beat)."""
        return published(self._collector.process())

    async def refresh(self) -> None:
        """Read the backlog and the other workers' figures from the database: done before
        each scrape. A database too slow to answer leaves the previous ones, so the scrape
        still reports everything else."""
        with trio.move_on_after(BACKLOG_TIMEOUT):
            found = await self._db.read(self._shared)
            self._collector.backlog, self._collector.others = found

    def _shared(self, tx: Tx) -> tuple[backlog.Backlog, list[str]]:
        others = (
            [] if self._instance is None else nodes.instance_metrics(tx, self._instance, self._node)
        )
        return backlog.read(tx), others

    def wrap(self, app: ASGIApp) -> ASGIApp:
        """The ASGI app with accept latency timed."""

        async def timed(scope: dict[str, Any], receive: Any, send: Any) -> None:
            http = scope["type"] == "http"
            endpoint = (
                ACCEPT_PATHS.get(scope["path"]) if http and scope["method"] == "POST" else None
            )
            if endpoint is None:
                await app(scope, receive, send)
                return
            started = time.perf_counter()

            async def send_timed(message: dict[str, Any]) -> None:
                if message["type"] == "http.response.start" and message["status"] == 202:
                    self.accept_latency.labels(endpoint).observe(time.perf_counter() - started)
                await send(message)

            await app(scope, receive, send_timed)

        return timed
