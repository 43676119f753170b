"""`/v1/privacy/`: erase one person's address from the workspace's data."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText
from api.validation import json_body
from engine import privacy

blueprint = Blueprint("privacy", __name__, url_prefix="/v1/privacy")


class EraseBody(BaseModel):
    email: EmailText


class ErasedOut(BaseModel):
    contacts: int
    emails: int
    events: int
    webhook_deliveries: int
    activity_entries: int
    suppression_hash: str  # what the suppression list keeps, so the address stays suppressed


@blueprint.post("/erase")
@json_body(EraseBody)
@document_response(ErasedOut)
async def erase(body: EraseBody) -> dict[str, Any]:
    erased = await privacy.erase(runtime(), principal(), body.email)
    return ErasedOut(
        contacts=erased.contacts,
        emails=erased.emails,
        events=erased.events,
        webhook_deliveries=erased.webhook_deliveries,
        activity_entries=erased.activity_entries,
        suppression_hash=erased.suppression_hash,
    ).model_dump()
