"""`/v1/workspace/unsubscribe-footer`: the footer with the unsubscribe link that mail
offering unsubscribe gets when its body does not place `{{unsubscribe_url}}` itself."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body
from engine.mail.unsubscribe_footer import MAX_FOOTER
from engine.sending import unsubscribe_footers
from engine.sending.unsubscribe_footers import FooterChange, FooterState

blueprint = Blueprint("unsubscribe_footer", __name__, url_prefix="/v1/workspace/unsubscribe-footer")


class UpdateFooter(In):
    """Only the fields given change; each wording must contain `{{unsubscribe_url}}`."""

    enabled: bool | None = None
    text: str | None = Field(None, min_length=1, max_length=MAX_FOOTER)
    html: str | None = Field(None, min_length=1, max_length=MAX_FOOTER)


class FooterOut(Out):
    enabled: bool
    text: str
    html: str
    updated_at: datetime | None  # null: never changed, the default


def _out(state: FooterState) -> dict[str, object]:
    footer = state.footer
    out = FooterOut(
        enabled=footer.enabled, text=footer.text, html=footer.html, updated_at=state.updated_at
    )
    return out.model_dump(mode="json")


@blueprint.get("")
@document_response(FooterOut)
async def get() -> dict[str, object]:
    return _out(await unsubscribe_footers.get(runtime(), principal()))


@blueprint.patch("")
@json_body(UpdateFooter)
@document_response(FooterOut)
async def update(body: UpdateFooter) -> dict[str, object]:
    change = FooterChange(body.enabled, body.text, body.html)
    return _out(await unsubscribe_footers.update(runtime(), principal(), change))
