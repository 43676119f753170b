"""`/v1/privacy/`: erase one person's address from the workspace's data; set how long the
workspace keeps content (`retention`, at most its plan's period)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In
from api.validation import json_body
from engine import privacy, retention
from engine.retention import Retention

blueprint = Blueprint("privacy", __name__, url_prefix="/v1/privacy")


class EraseBody(In):
    email: EmailText


class ErasedOut(BaseModel):
    """How many records of each kind the erasure deleted or rewrote."""

    contacts: int
    emails: int
    events: int
    webhook_deliveries: int
    activity_entries: int
    forward_logs: int
    forward_jobs: int
    inbound_messages: int
    sandbox_outcomes: int
    saved_searches: int
    agent_previews: int
    idempotent_responses: int
    delivery_incidents: int
    templates: int
    broadcasts: int
    contact_lists: int
    other_contacts: int
    sandbox_requests: int  # webhook and forward POSTs the sandbox captured
    postmaster_mail: int  # mail kept from postmaster@ and abuse@ of the workspace's domains
    suppression_hash: str  # what the suppression list keeps, so the address stays suppressed


@blueprint.post("/erase")
@json_body(EraseBody)
@document_response(ErasedOut)
async def erase(body: EraseBody) -> dict[str, Any]:
    erased = await privacy.erase(runtime(), principal(), body.email)
    return ErasedOut(
        contacts=erased.contacts, suppression_hash=erased.suppression_hash, **erased.touched
    ).model_dump()


class RetentionOut(BaseModel):
    days: int = Field(description="the period that applies: content older than this is deleted")
    custom_days: int | None = Field(description="the workspace's own period; null: the plan's")
    plan_days: int = Field(description="the plan's period: the default and the longest")


class RetentionChange(In):
    days: int | None = Field(description="1 to the plan's period; null: back to the plan's period")


def _retention_out(current: Retention) -> dict[str, Any]:
    return RetentionOut(
        days=current.days, custom_days=current.custom_days, plan_days=current.plan_days
    ).model_dump()


@blueprint.get("/retention")
@document_response(RetentionOut)
async def get_retention() -> dict[str, Any]:
    return _retention_out(await retention.current(runtime(), principal()))


@blueprint.put("/retention")
@json_body(RetentionChange)
@document_response(RetentionOut)
async def put_retention(body: RetentionChange) -> dict[str, Any]:
    return _retention_out(await retention.change(runtime(), principal(), body.days))
