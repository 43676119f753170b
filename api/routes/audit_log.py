"""`/v1/audit-log`: the workspace activity log, newest first."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import query_args
from engine import activity

blueprint = Blueprint("audit_log", __name__, url_prefix="/v1/audit-log")


class AuditQuery(In):
    range: Literal["24h", "7d", "30d", "90d"] = "30d"
    category: str | None = None
    limit: int = Field(100, ge=1, le=500)

    @field_validator("category")
    @classmethod
    def known_category(cls, value: str | None) -> str | None:
        if value is None:
            return None
        category = activity.canonical_category(value)
        if category is None:
            raise ValueError(f"category must be one of {', '.join(activity.CATEGORIES)}")
        return category


class EntryOut(Out):
    id: str
    actor: str
    action: str
    target_type: str
    target_name: str
    target_id: str | None
    category: str
    meta: dict[str, Any]
    created_at: datetime


class AuditPage(BaseModel):
    items: list[EntryOut]
    range: str
    total: int


@blueprint.get("")
@query_args(AuditQuery)
@document_response(AuditPage)
async def audit_log(query: AuditQuery) -> dict[str, object]:
    items, total = await activity.recent(
        runtime(), principal(), query.range, query.category, query.limit
    )
    page = AuditPage(
        items=[EntryOut.model_validate(i) for i in items], range=query.range, total=total
    )
    return page.model_dump(mode="json")
