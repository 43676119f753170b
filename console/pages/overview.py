"""The overview: sent, delivered, bounced and complained as a chart (server-rendered SVG),
the rates per sending domain, tag or broadcast over the same range, the recipients waiting
per recipient domain with the delivery forecast, dead webhook deliveries, and health."""

from __future__ import annotations

from dataclasses import dataclass

from quart import Blueprint, Response, current_app, request

from console.web import page, rt, who
from engine import mail_stats, overview
from engine.delivery import forecast
from engine.platform.supervisor import Supervisor
from storage.mail_stats import Grouping

blueprint = Blueprint("overview", __name__)

WIDTH, HEIGHT, MARGIN = 720, 240, 36


@dataclass(frozen=True, slots=True)
class Chart:
    series: dict[str, str]  # event type -> SVG polyline points
    peak: int
    labels: list[tuple[float, str]]  # (x, text) under the axis


def chart(found: overview.Overview) -> Chart:
    buckets = found.buckets
    peak = max([1, *(b.counts[k] for b in buckets for k in overview.COUNTED)])
    step = (WIDTH - 2 * MARGIN) / max(1, len(buckets) - 1)

    def point(i: int, value: int) -> str:
        y = HEIGHT - MARGIN - value / peak * (HEIGHT - 2 * MARGIN)
        return f"{MARGIN + i * step:.1f},{y:.1f}"

    series = {
        kind: " ".join(point(i, b.counts[kind]) for i, b in enumerate(buckets))
        for kind in overview.COUNTED
    }
    hourly = found.range == "24h"
    fmt = "%H:00" if hourly else "%b %d"
    picks = sorted({0, len(buckets) // 2, len(buckets) - 1})
    labels = [(MARGIN + i * step, buckets[i].start.strftime(fmt)) for i in picks]
    return Chart(series, peak, labels)


@blueprint.get("/")
async def index() -> Response:
    range_name = request.args.get("range", "7d")
    if range_name not in overview.RANGES:
        range_name = "7d"
    found = await overview.read(rt(), who(), range_name)
    wanted = request.args.get("by")
    by: Grouping = next((g for g in mail_stats.GROUPINGS if g == wanted), "domain")
    rates = await mail_stats.rates(rt(), who(), by, range_name)
    # Only with a backlog: the forecast looks up the MX hosts of the waiting domains.
    upcoming = await forecast.forecast(rt(), who()) if found.backlog else None
    supervisor: Supervisor = current_app.extensions["postroom.supervisor"]
    storage_full = rt().db.storage_full
    return await page(
        "overview.html",
        title="Overview",
        overview=found,
        chart=chart(found),
        forecast=upcoming,
        size=(WIDTH, HEIGHT, MARGIN),
        ranges=list(overview.RANGES),
        rates=rates,
        groupings=mail_stats.GROUPINGS,
        actors_running=supervisor.running,
        storage_full=None if storage_full is None else storage_full.reason,
    )
