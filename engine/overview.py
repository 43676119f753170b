"""A workspace at a glance, for the console's first page: sent, delivered, bounced and
complained over the last 24 hours (by hour) or 7 or 30 days (by day), the recipients still
waiting per recipient domain, the open destination incidents, and the webhook deliveries that
went dead."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.platform.runtime import Principal, Runtime
from storage import incidents, overview
from storage.codec import timestamp
from storage.incidents import Incident
from storage.tx import Tx

COUNTED = overview.COUNTED
# range -> (length, bucket, characters of a stored timestamp naming the bucket)
SHOWN_INCIDENTS = 20  # the most recently seen open ones; the API lists them all
RANGES = {
    "24h": (timedelta(hours=24), timedelta(hours=1), 13),
    "7d": (timedelta(days=7), timedelta(days=1), 10),
    "30d": (timedelta(days=30), timedelta(days=1), 10),
}


@dataclass(frozen=True, slots=True)
class Bucket:
    start: datetime
    counts: dict[str, int]  # per counted event type


@dataclass(frozen=True, slots=True)
class Overview:
    range: str
    buckets: list[Bucket]
    totals: dict[str, int]
    backlog: list[tuple[str, str, int]]  # (recipient domain, status, recipients)
    dead_webhook_deliveries: int
    incidents: list[Incident]  # open, most recently seen first


def _starts(now: datetime, length: timedelta, step: timedelta) -> list[datetime]:
    if step == timedelta(hours=1):
        last = now.replace(minute=0, second=0, microsecond=0)
    else:
        last = now.replace(hour=0, minute=0, second=0, microsecond=0)
    count = int(length / step)
    return [last - step * (count - 1 - i) for i in range(count)]


def _read(
    tx: Tx, workspace_id: str, since: datetime, chars: int
) -> tuple[dict[tuple[str, str], int], list[tuple[str, str, int]], int, list[Incident]]:
    return (
        overview.event_counts(tx, workspace_id, since, chars),
        overview.backlog(tx, workspace_id),
        overview.dead_webhook_deliveries(tx, workspace_id),
        incidents.of_workspace(tx, workspace_id, "open", SHOWN_INCIDENTS),
    )


async def read(rt: Runtime, who: Principal, range_name: str) -> Overview:
    """The workspace's overview for `range_name` (24h, 7d or 30d)."""
    length, step, chars = RANGES[range_name]
    starts = _starts(rt.clock.now(), length, step)
    counts, waiting, dead, paused = await rt.db.read(_read, who.workspace_id, starts[0], chars)
    buckets = [
        Bucket(start, {kind: counts.get((kind, timestamp(start)[:chars]), 0) for kind in COUNTED})
        for start in starts
    ]
    totals = {kind: sum(b.counts[kind] for b in buckets) for kind in COUNTED}
    return Overview(range_name, buckets, totals, waiting, dead, paused)
