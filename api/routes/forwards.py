"""`/v1/forwards/`: inbound forwarding rules, their log and statistics.

The fixed paths (`logs`, `logs/count`, `stats`) are declared before `{forward_id}`; the id
converter matches only UUIDs, so they can never be taken for an id either way.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out, PageQuery
from api.validation import json_body, query_args
from engine.forwarding import rules as forwards
from storage.forwards import Forward

blueprint = Blueprint("forwards", __name__, url_prefix="/v1/forwards")

_UUID = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"


class CreateForward(In):
    # Optional here so a missing field is the spec's 400, not the generic 422.
    source_email: str | None = Field(None, max_length=320)
    domain_id: str | None = Field(None, max_length=64)
    destination_emails: list[str] | None = None
    destination_urls: list[str] | None = None


class UpdateForward(In):
    destination_emails: list[str] | None = None
    destination_urls: list[str] | None = None
    is_active: bool | None = None


class ForwardOut(Out):
    id: str
    source_email: str
    destination_emails: list[str]
    destination_urls: list[str]
    domain_id: str
    is_active: bool
    last_delivered_at: datetime | None
    delivery_count: int
    created_at: datetime


class LogEntryOut(Out):
    id: str
    forward_id: str
    from_address: str
    original_to: str
    forwarded_to: str
    subject: str
    message_id: str
    size_bytes: int
    created_at: datetime


class LogQuery(PageQuery):
    forward_id: str | None = Field(None, pattern=_UUID)


class CountQuery(In):
    forward_id: str | None = Field(None, pattern=_UUID)


class LogCount(BaseModel):
    count: int


class StatsOut(Out):
    total_this_month: int
    per_rule: dict[str, int]


def _forward(forward: Forward) -> dict[str, Any]:
    return ForwardOut.model_validate(forward).model_dump(mode="json")


def _lower(value: str | None) -> str | None:
    return None if value is None else value.lower()


@blueprint.get("/logs")
@query_args(LogQuery)
@document_response(list[LogEntryOut])
async def logs(query: LogQuery) -> list[dict[str, Any]]:
    entries = await forwards.logs(
        runtime(), principal(), _lower(query.forward_id), query.page, query.limit
    )
    return [LogEntryOut.model_validate(e).model_dump(mode="json") for e in entries]


@blueprint.get("/logs/count")
@query_args(CountQuery)
@document_response(LogCount)
async def logs_count(query: CountQuery) -> dict[str, Any]:
    count = await forwards.logs_count(runtime(), principal(), _lower(query.forward_id))
    return {"count": count}


@blueprint.get("/stats")
@document_response(StatsOut)
async def stats() -> dict[str, Any]:
    found = await forwards.stats(runtime(), principal())
    return StatsOut.model_validate(found).model_dump(mode="json")


@blueprint.post("/")
@json_body(CreateForward)
@document_response(ForwardOut, 201)
async def create(body: CreateForward) -> tuple[dict[str, Any], int]:
    forward = await forwards.create(
        runtime(),
        principal(),
        body.source_email,
        body.domain_id,
        body.destination_emails,
        body.destination_urls,
    )
    return _forward(forward), 201


@blueprint.get("/")
@document_response(list[ForwardOut])
async def list_forwards() -> list[dict[str, Any]]:
    return [_forward(f) for f in await forwards.list_all(runtime(), principal())]


@blueprint.patch("/<id:forward_id>")
@json_body(UpdateForward)
@document_response(ForwardOut)
async def update(forward_id: str, body: UpdateForward) -> dict[str, Any]:
    forward = await forwards.update(
        runtime(),
        principal(),
        forward_id,
        body.destination_emails,
        body.destination_urls,
        body.is_active,
    )
    return _forward(forward)


@blueprint.delete("/<id:forward_id>")
async def delete(forward_id: str) -> Response:
    await forwards.delete(runtime(), principal(), forward_id)
    return Response(b"", status=204)
