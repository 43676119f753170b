"""Webhooks: endpoints, their deliveries by status, the dead letters with replay (one, or all
of an endpoint's), a test delivery, and the signing secret behind a reveal."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.webhooks import DELIVERY_STATUSES, CreateWebhook
from console.web import go, page, parse, problems_of, rt, who
from engine.platform.errors import EngineError
from engine.webhooks import endpoints as webhooks
from engine.webhooks.outbox import EVENT_TYPES
from storage.webhooks import ReplayFilter

blueprint = Blueprint("webhooks", __name__)

PAGE_SIZE = 25
DONE = {
    "created": "Webhook created.",
    "deleted": "Webhook deleted.",
    "tested": "A sample email.delivered was queued.",
    "replayed": "Delivery queued again.",
    "replayed_all": "Every dead delivery was queued again.",
}


async def _index(status: int = 200, **extra: Any) -> Response:
    found = await webhooks.list_active(rt(), who())
    extra.setdefault("problems", {})
    extra.setdefault("values", {"events": list(EVENT_TYPES)})
    return await page(
        "webhooks.html",
        status=status,
        title="Webhooks",
        webhooks=found,
        event_types=EVENT_TYPES,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/webhooks")
async def index() -> Response:
    return await _index()


@blueprint.post("/webhooks")
async def create() -> Response:
    data = await request.form
    values = {"url": data.get("url", ""), "events": data.getlist("events")}
    body, problems = parse(CreateWebhook, values)
    if body is None:
        return await _index(422, values=values, problems=problems)
    try:
        hook = await webhooks.create(rt(), who(), body.url, body.events)
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.webhooks.detail", webhook_id=hook.id, done="created")


async def _detail(webhook_id: str, status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    hook = await webhooks.get(runtime, principal, webhook_id)
    wanted = request.args.get("status") or None
    if wanted not in (None, *DELIVERY_STATUSES):
        wanted = None
    page_number = max(0, request.args.get("page", 0, type=int) or 0)
    items, total = await webhooks.deliveries(
        runtime, principal, webhook_id, wanted, page_number, PAGE_SIZE
    )
    _, dead = await webhooks.deliveries(runtime, principal, webhook_id, "dead", 0, 1)
    extra.setdefault("problems", {})
    return await page(
        "webhook.html",
        status=status,
        title=hook.url,
        webhook=hook,
        deliveries=items,
        total=total,
        dead=dead,
        wanted=wanted,
        statuses=DELIVERY_STATUSES,
        page_number=page_number,
        more=(page_number + 1) * PAGE_SIZE < total,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/webhooks/<id:webhook_id>")
async def detail(webhook_id: str) -> Response:
    return await _detail(webhook_id)


@blueprint.post("/webhooks/<id:webhook_id>/test")
async def test(webhook_id: str) -> Response:
    await webhooks.send_test(rt(), who(), webhook_id)
    return go("console.webhooks.detail", webhook_id=webhook_id, done="tested")


@blueprint.post("/webhooks/<id:webhook_id>/delete")
async def delete(webhook_id: str) -> Response:
    await webhooks.delete(rt(), who(), webhook_id)
    return go("console.webhooks.index", done="deleted")


@blueprint.post("/webhooks/<id:webhook_id>/deliveries/<id:delivery_id>/replay")
async def replay(webhook_id: str, delivery_id: str) -> Response:
    runtime, principal = rt(), who()
    try:
        await webhooks.delivery(runtime, principal, delivery_id, webhook_id)
        await webhooks.replay(runtime, principal, delivery_id)
    except EngineError as exc:
        return await _detail(webhook_id, status_of(exc), problems=problems_of(exc))
    return go("console.webhooks.detail", webhook_id=webhook_id, status="dead", done="replayed")


@blueprint.post("/webhooks/<id:webhook_id>/replay-dead")
async def replay_dead(webhook_id: str) -> Response:
    """Queue every dead delivery of the endpoint again: the API's bulk replay, one unit of
    work, logged in the activity log."""
    match = ReplayFilter(webhook_id, "dead", None, None, ())
    await webhooks.replay_matching(rt(), who(), match, dry_run=False)
    return go("console.webhooks.detail", webhook_id=webhook_id, done="replayed_all")
