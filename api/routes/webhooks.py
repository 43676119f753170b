"""`/v1/webhooks/` and `/v1/webhook-deliveries/`: endpoints, their deliveries, replay."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Literal

from pydantic import AwareDatetime, BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out, PageQuery
from api.validation import json_body, query_args
from engine.webhooks import endpoints as webhooks
from storage.webhooks import BasicAuth, Delivery, ReplayFilter, Webhook

blueprint = Blueprint("webhooks", __name__, url_prefix="/v1")

DELIVERY_STATUSES = ("pending", "delivered", "retrying", "dead")


Format = Literal["postroom", "listmonk", "sendgrid", "ses", "postmark"]  # profiles.FORMATS


class BasicAuthIn(In):
    """Credentials the receiver expects, sent as `Authorization: Basic`; stored sealed and
    never shown again (responses carry the username only)."""

    # RFC 7617: the user-id holds no colon; neither holds a control character (header text).
    username: str = Field(min_length=1, max_length=200, pattern=r"^[^:\x00-\x1f\x7f]+$")
    password: str = Field(min_length=1, max_length=200, pattern=r"^[^\x00-\x1f\x7f]+$")

    def credentials(self) -> BasicAuth:
        return BasicAuth(self.username, self.password)


class CreateWebhook(In):
    url: str = Field(min_length=1, max_length=2000)
    events: list[str] = Field(max_length=20)
    format: Format = "postroom"
    basic_auth: BasicAuthIn | None = None


class UpdateWebhook(In):
    url: str | None = Field(None, min_length=1, max_length=2000)
    events: list[str] | None = Field(None, max_length=20)
    is_active: bool | None = None
    format: Format | None = None
    basic_auth: BasicAuthIn | None = Field(None, description="null removes them; omitted: kept")


class BasicAuthOut(Out):
    username: str


class WebhookOut(Out):
    id: str
    url: str
    events: list[str]
    secret: str
    is_active: bool
    format: str
    basic_auth: BasicAuthOut | None
    created_at: datetime


class TestQueued(BaseModel):
    queued: bool
    url: str


class DeliveryItem(Out):
    id: str
    webhook_id: str
    event_type: str
    status: str
    response_status: int | None
    attempt: int
    next_retry_at: datetime | None
    created_at: datetime


class DeliveryOut(DeliveryItem):
    payload: dict[str, Any]
    response_body: str | None
    endpoint_url: str


class DeliveryPage(BaseModel):
    items: list[DeliveryItem]
    total: int
    page: int
    limit: int


class DeliveryQuery(PageQuery):
    status: Literal[DELIVERY_STATUSES] | None = None  # type: ignore[valid-type]


class BulkReplay(In):
    status: Literal["dead", "delivered"] = "dead"
    since: AwareDatetime | None = None
    until: AwareDatetime | None = None
    event_types: list[str] = Field(default_factory=list, max_length=20)
    dry_run: bool = False


class BulkReplayOut(BaseModel):
    matched: int
    replayed: int
    dry_run: bool


def _webhook(hook: Webhook) -> dict[str, Any]:
    return WebhookOut.model_validate(hook).model_dump(mode="json")


def _delivery(found: Delivery) -> dict[str, Any]:
    item = DeliveryItem.model_validate(found).model_dump()
    out = DeliveryOut(
        **item,
        payload=json.loads(found.payload),
        response_body=found.response_body,
        endpoint_url=found.endpoint_url,
    )
    return out.model_dump(mode="json")


@blueprint.get("/webhooks/")
@document_response(list[WebhookOut])
async def list_webhooks() -> list[dict[str, Any]]:
    return [_webhook(h) for h in await webhooks.list_active(runtime(), principal())]


@blueprint.post("/webhooks/")
@json_body(CreateWebhook)
@document_response(WebhookOut, 201)
async def create(body: CreateWebhook) -> tuple[dict[str, Any], int]:
    auth = None if body.basic_auth is None else body.basic_auth.credentials()
    hook = await webhooks.create(runtime(), principal(), body.url, body.events, body.format, auth)
    return _webhook(hook), 201


@blueprint.patch("/webhooks/<id:webhook_id>")
@json_body(UpdateWebhook)
@document_response(WebhookOut)
async def update(webhook_id: str, body: UpdateWebhook) -> dict[str, Any]:
    auth: BasicAuth | Literal["keep"] | None = webhooks.KEEP
    if "basic_auth" in body.model_fields_set:
        auth = None if body.basic_auth is None else body.basic_auth.credentials()
    hook = await webhooks.update(
        runtime(), principal(), webhook_id, body.url, body.events, body.is_active, body.format, auth
    )
    return _webhook(hook)


@blueprint.delete("/webhooks/<id:webhook_id>")
async def delete(webhook_id: str) -> Response:
    await webhooks.delete(runtime(), principal(), webhook_id)
    return Response(b"", status=204)


@blueprint.post("/webhooks/<id:webhook_id>/test")
@document_response(TestQueued)
async def send_test(webhook_id: str) -> dict[str, Any]:
    hook = await webhooks.send_test(runtime(), principal(), webhook_id)
    return {"queued": True, "url": hook.url}


@blueprint.post("/webhooks/<id:webhook_id>/replay")
@json_body(BulkReplay)
@document_response(BulkReplayOut)
async def replay_matching(webhook_id: str, body: BulkReplay) -> dict[str, Any]:
    match = ReplayFilter(webhook_id, body.status, body.since, body.until, tuple(body.event_types))
    count = await webhooks.replay_matching(runtime(), principal(), match, body.dry_run)
    out = BulkReplayOut(matched=count, replayed=0 if body.dry_run else count, dry_run=body.dry_run)
    return out.model_dump()


@blueprint.get("/webhooks/<id:webhook_id>/deliveries")
@query_args(DeliveryQuery)
@document_response(DeliveryPage)
async def deliveries(webhook_id: str, query: DeliveryQuery) -> dict[str, Any]:
    items, total = await webhooks.deliveries(
        runtime(), principal(), webhook_id, query.status, query.page, query.limit
    )
    page = DeliveryPage(
        items=[DeliveryItem.model_validate(d) for d in items],
        total=total,
        page=query.page,
        limit=query.limit,
    )
    return page.model_dump(mode="json")


@blueprint.get("/webhooks/<id:webhook_id>/deliveries/<id:delivery_id>")
@document_response(DeliveryOut)
async def delivery_of_webhook(webhook_id: str, delivery_id: str) -> dict[str, Any]:
    return _delivery(await webhooks.delivery(runtime(), principal(), delivery_id, webhook_id))


@blueprint.get("/webhook-deliveries/<id:delivery_id>")
@document_response(DeliveryOut)
async def delivery(delivery_id: str) -> dict[str, Any]:
    return _delivery(await webhooks.delivery(runtime(), principal(), delivery_id))


@blueprint.post("/webhook-deliveries/<id:delivery_id>/replay")
@document_response(DeliveryOut)
async def replay(delivery_id: str) -> dict[str, Any]:
    return _delivery(await webhooks.replay(runtime(), principal(), delivery_id))
