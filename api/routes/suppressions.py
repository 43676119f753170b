"""`/v1/suppressions/`: list, add (manual entries) and remove suppressed addresses."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In, Out, PageQuery
from api.validation import json_body, query_args
from engine.suppressions import entries as suppressions

blueprint = Blueprint("suppressions", __name__, url_prefix="/v1/suppressions")


class AddSuppression(In):
    email: EmailText
    reason: str = "manual"


class SuppressionQuery(PageQuery):
    q: str | None = Field(None, max_length=320)


class SuppressionOut(Out):
    email: str
    reason: str
    created_at: datetime
    source_email_id: str | None


class SuppressionPage(BaseModel):
    items: list[SuppressionOut]
    total: int
    page: int
    limit: int


@blueprint.get("/")
@query_args(SuppressionQuery)
@document_response(SuppressionPage)
async def list_suppressions(query: SuppressionQuery) -> dict[str, object]:
    items, total = await suppressions.page(runtime(), principal(), query.page, query.limit, query.q)
    out = SuppressionPage(
        items=[SuppressionOut.model_validate(i) for i in items],
        total=total,
        page=query.page,
        limit=query.limit,
    )
    return out.model_dump(mode="json")


@blueprint.post("/")
@json_body(AddSuppression)
@document_response(SuppressionOut, 201)
async def add(body: AddSuppression) -> tuple[dict[str, object], int]:
    entry, created = await suppressions.add(runtime(), principal(), body.email, body.reason)
    return SuppressionOut.model_validate(entry).model_dump(mode="json"), 201 if created else 200


@blueprint.delete("/<path:email>")
async def remove(email: str) -> Response:
    await suppressions.remove(runtime(), principal(), email)
    return Response(b"", status=204)
