"""The activity log: every change to the workspace's resources, by range and category."""

from __future__ import annotations

from quart import Blueprint, Response, request

from console.web import page, rt, who
from engine import activity

blueprint = Blueprint("activity", __name__)

LIMIT = 200


@blueprint.get("/activity")
async def index() -> Response:
    range_name = request.args.get("range", "7d")
    if range_name not in activity.RANGES:
        range_name = "7d"
    category = activity.canonical_category(request.args.get("category", ""))
    items, total = await activity.recent(rt(), who(), range_name, category, LIMIT)
    return await page(
        "activity.html",
        title="Activity",
        items=items,
        total=total,
        range_name=range_name,
        ranges=list(activity.RANGES),
        category=category,
        categories=activity.CATEGORIES,
    )
