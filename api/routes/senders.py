"""`/v1/senders/`: the addresses mail may be sent from."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In, Out
from api.validation import json_body
from engine.domains import senders

blueprint = Blueprint("senders", __name__, url_prefix="/v1/senders")


class CreateSender(In):
    email: EmailText
    name: str | None = Field(None, max_length=200)


class SenderOut(Out):
    id: str
    email: str
    name: str | None
    domain_id: str
    is_active: bool
    created_at: datetime


@blueprint.post("/")
@json_body(CreateSender)
@document_response(SenderOut, 201)
async def create(body: CreateSender) -> tuple[dict[str, object], int]:
    sender = await senders.create(runtime(), principal(), body.email, body.name)
    return SenderOut.model_validate(sender).model_dump(mode="json"), 201


@blueprint.get("/")
@document_response(list[SenderOut])
async def list_senders() -> list[dict[str, object]]:
    found = await senders.list_all(runtime(), principal())
    return [SenderOut.model_validate(s).model_dump(mode="json") for s in found]


@blueprint.delete("/<id:sender_id>")
async def delete(sender_id: str) -> Response:
    await senders.delete(runtime(), principal(), sender_id)
    return Response(b"", status=204)
