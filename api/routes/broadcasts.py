"""`/v1/broadcasts/`: the bulk sends of the workspace, newest first, each one's figures
(engine/mail_stats.py), and resuming one the complaint-rate guard paused
(engine/contacts/complaint_guard.py)."""

from __future__ import annotations

from datetime import datetime

from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import Out, PageQuery
from api.routes.stats import FiguresOut, figures
from api.validation import query_args
from engine import mail_stats
from engine.contacts import bulk_send, complaint_guard

blueprint = Blueprint("broadcasts", __name__, url_prefix="/v1/broadcasts")


class BroadcastOut(Out):
    id: str
    name: str
    contact_list_id: str
    sender_id: str
    domain_id: str
    from_address: str
    tags: list[str]
    status: str
    queued: int
    skipped: int
    failure_reason: str | None
    pause_reason: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None


@blueprint.get("/")
@query_args(PageQuery)
@document_response(list[BroadcastOut])
async def list_broadcasts(query: PageQuery) -> list[dict[str, object]]:
    found = await bulk_send.broadcasts_page(runtime(), principal(), query.page, query.limit)
    return [BroadcastOut.model_validate(b).model_dump(mode="json") for b in found]


@blueprint.get("/<id:broadcast_id>")
@document_response(BroadcastOut)
async def get(broadcast_id: str) -> dict[str, object]:
    found = await bulk_send.broadcast(runtime(), principal(), broadcast_id)
    return BroadcastOut.model_validate(found).model_dump(mode="json")


@blueprint.get("/<id:broadcast_id>/stats")
@document_response(FiguresOut)
async def stats(broadcast_id: str) -> dict[str, object]:
    found = await mail_stats.of_broadcast(runtime(), principal(), broadcast_id)
    return FiguresOut.model_validate(figures(found)).model_dump(mode="json")


@blueprint.post("/<id:broadcast_id>/resume")
@document_response(BroadcastOut)
async def resume(broadcast_id: str) -> dict[str, object]:
    resumed = await complaint_guard.resume(runtime(), principal(), broadcast_id)
    return BroadcastOut.model_validate(resumed).model_dump(mode="json")
