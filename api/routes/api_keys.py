"""`/v1/api-keys/`: create (the raw key shown once), list the active ones, delete."""

from __future__ import annotations

from datetime import datetime

from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Name, Out
from api.validation import json_body
from engine.accounts import api_keys

blueprint = Blueprint("api_keys", __name__, url_prefix="/v1/api-keys")


class CreateApiKey(In):
    name: Name
    permissions: list[str] | None = None


class ApiKeyCreated(Out):
    id: str
    name: str
    key: str
    key_prefix: str
    permissions: list[str]
    created_at: datetime


class ApiKeyItem(Out):
    id: str
    name: str
    key_prefix: str
    permissions: list[str]
    is_active: bool
    last_used_at: datetime | None
    created_at: datetime


@blueprint.post("/")
@json_body(CreateApiKey)
@document_response(ApiKeyCreated, 201)
async def create(body: CreateApiKey) -> tuple[dict[str, object], int]:
    created = await api_keys.create(runtime(), principal(), body.name, body.permissions)
    key = created.key
    out = ApiKeyCreated(
        id=key.id,
        name=key.name,
        key=created.raw,
        key_prefix=key.key_prefix,
        permissions=list(key.permissions),
        created_at=key.created_at,
    )
    return out.model_dump(mode="json"), 201


@blueprint.get("/")
@document_response(list[ApiKeyItem])
async def list_keys() -> list[dict[str, object]]:
    keys = await api_keys.list_active(runtime(), principal())
    return [ApiKeyItem.model_validate(k).model_dump(mode="json") for k in keys]


@blueprint.delete("/<id:key_id>")
async def delete(key_id: str) -> Response:
    await api_keys.delete(runtime(), principal(), key_id)
    return Response(b"", status=204)
