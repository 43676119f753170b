"""Forwards (Starter plan and above): the rules, pause and resume, delete, the log of
forwarded copies and this month's counts."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from console.web import form, go, page, problems_of, rt, who
from engine import plans
from engine.domains import registry
from engine.forwarding import rules as forwards
from engine.platform.errors import EngineError

blueprint = Blueprint("forwards", __name__)

LOG_SIZE = 50
DONE = {
    "created": "Forward created.",
    "paused": "Forward paused.",
    "resumed": "Forward resumed.",
    "deleted": "Forward deleted.",
}


def _split(text: str) -> list[str]:
    return [part.strip() for part in text.replace("\n", ",").split(",") if part.strip()]


async def _index(status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    if plans.plan(principal.plan).forwards == 0:
        return await page("forwards.html", title="Forwards", available=False)
    domains = [d for d in await registry.list_all(runtime, principal) if d.status == "verified"]
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "forwards.html",
        status=status,
        title="Forwards",
        available=True,
        forwards=await forwards.list_all(runtime, principal),
        logs=await forwards.logs(runtime, principal, None, 0, LOG_SIZE),
        stats=await forwards.stats(runtime, principal),
        domains=domains,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/forwards")
async def index() -> Response:
    return await _index()


@blueprint.post("/forwards")
async def create() -> Response:
    values = await form()
    try:
        await forwards.create(
            rt(),
            who(),
            values.get("source_email", "").strip() or None,
            values.get("domain_id") or None,
            _split(values.get("destination_emails", "")),
            _split(values.get("destination_urls", "")),
        )
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.forwards.index", done="created")


@blueprint.post("/forwards/<id:forward_id>/active")
async def set_active(forward_id: str) -> Response:
    active = (await form()).get("active") == "on"
    await forwards.update(rt(), who(), forward_id, None, None, active)
    return go("console.forwards.index", done="resumed" if active else "paused")


@blueprint.post("/forwards/<id:forward_id>/delete")
async def delete(forward_id: str) -> Response:
    await forwards.delete(rt(), who(), forward_id)
    return go("console.forwards.index", done="deleted")
