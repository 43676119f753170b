"""Suppressions: the list with each entry's reason and source email, add, remove, and where
each address stands in its 24-hour override window."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.suppressions import AddSuppression
from console.web import form, go, page, parse, problems_of, rt, who
from engine.platform.errors import EngineError
from engine.suppressions import entries as suppressions
from engine.suppressions import windows

blueprint = Blueprint("suppressions", __name__)

PAGE_SIZE = 50
DONE = {
    "added": "Address suppressed.",
    "exists": "That address was suppressed already.",
    "removed": "Suppression lifted.",
}


async def _index(status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    search = request.args.get("q", "")[:320] or None
    page_number = max(0, request.args.get("page", 0, type=int) or 0)
    items, total = await suppressions.page(runtime, principal, page_number, PAGE_SIZE, search)
    found = await windows.windows(runtime, principal, [i.email for i in items])
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "suppressions.html",
        status=status,
        title="Suppressions",
        items=items,
        windows=found,
        total=total,
        search=search or "",
        page_number=page_number,
        more=(page_number + 1) * PAGE_SIZE < total,
        reasons=suppressions.REASONS,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/suppressions")
async def index() -> Response:
    return await _index()


@blueprint.post("/suppressions")
async def add() -> Response:
    values = await form()
    body, problems = parse(AddSuppression, values)
    if body is None:
        return await _index(422, values=values, problems=problems)
    try:
        _, created = await suppressions.add(rt(), who(), body.email, body.reason)
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.suppressions.index", done="added" if created else "exists")


@blueprint.post("/suppressions/remove")
async def remove() -> Response:
    address = (await form()).get("email", "")
    try:
        await suppressions.remove(rt(), who(), address)
    except EngineError as exc:
        return await _index(status_of(exc), problems=problems_of(exc))
    return go("console.suppressions.index", done="removed")
