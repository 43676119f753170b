"""`/v1/delivery/incidents`: destinations blocking or slowing the workspace's sending domains,
and resolving one by hand."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import query_args
from engine.delivery import incidents
from storage.incidents import Incident

blueprint = Blueprint("delivery_incidents", __name__, url_prefix="/v1/delivery")


class IncidentQuery(In):
    status: Literal["open", "resolved", "all"] = "open"
    limit: int = Field(50, ge=1, le=200)


class IncidentOut(BaseModel):
    id: str
    destination: str
    sending_domain: str
    kind: str
    status: str
    strikes: int
    sample_reply: str
    first_seen_at: datetime
    last_seen_at: datetime
    paused_until: datetime
    resolved_at: datetime | None


class IncidentList(BaseModel):
    items: list[IncidentOut]


def incident_out(i: Incident) -> IncidentOut:
    return IncidentOut(
        id=i.id,
        destination=i.destination,
        sending_domain=i.sending_domain,
        kind=i.kind,
        status="open" if i.resolved_at is None else "resolved",
        strikes=i.strikes,
        sample_reply=i.sample_reply,
        first_seen_at=i.first_seen_at,
        last_seen_at=i.last_seen_at,
        paused_until=i.paused_until,
        resolved_at=i.resolved_at,
    )


@blueprint.get("/incidents")
@query_args(IncidentQuery)
@document_response(IncidentList)
async def list_incidents(query: IncidentQuery) -> dict[str, Any]:
    found = await incidents.listed(runtime(), principal(), query.status, query.limit)
    return IncidentList(items=[incident_out(i) for i in found]).model_dump(mode="json")


@blueprint.post("/incidents/<id:incident_id>/resolve")
@document_response(IncidentOut)
async def resolve_incident(incident_id: str) -> dict[str, Any]:
    resolved = await incidents.resolve(runtime(), principal(), incident_id)
    return incident_out(resolved).model_dump(mode="json")
