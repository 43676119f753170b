"""`/v1/domains/{id}/postmaster-mail`: the mail sent to postmaster@ and abuse@ of a domain
that was not a complaint Postroom could read (engine/forwarding/postmaster.py), newest
first, paged as the spec pages webhook deliveries; and one message with what was kept of it.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import Out, PageQuery
from api.validation import query_args
from engine.forwarding import postmaster

blueprint = Blueprint("postmaster_mail", __name__, url_prefix="/v1/domains")


class PostmasterMailItem(Out):
    id: str
    domain_id: str
    recipient: str
    envelope_from: str
    from_header: str
    subject: str
    message_id: str
    size_bytes: int
    truncated: bool
    received_at: datetime


class PostmasterMailOut(PostmasterMailItem):
    # The message as it arrived, up to its first 256 KiB (`truncated` when cut there).
    raw: str


class PostmasterMailPage(BaseModel):
    items: list[PostmasterMailItem]
    total: int
    page: int
    limit: int


@blueprint.get("/<id:domain_id>/postmaster-mail")
@query_args(PageQuery)
@document_response(PostmasterMailPage)
async def list_mail(domain_id: str, query: PageQuery) -> dict[str, Any]:
    items, total = await postmaster.page(runtime(), principal(), domain_id, query.page, query.limit)
    page = PostmasterMailPage(
        items=[PostmasterMailItem.model_validate(m) for m in items],
        total=total,
        page=query.page,
        limit=query.limit,
    )
    return page.model_dump(mode="json")


@blueprint.get("/<id:domain_id>/postmaster-mail/<id:mail_id>")
@document_response(PostmasterMailOut)
async def get_mail(domain_id: str, mail_id: str) -> dict[str, Any]:
    found = await postmaster.get(runtime(), principal(), domain_id, mail_id)
    item = PostmasterMailItem.model_validate(found).model_dump()
    out = PostmasterMailOut(**item, raw=found.content.decode("utf-8", "replace"))
    return out.model_dump(mode="json")
