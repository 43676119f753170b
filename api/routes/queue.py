"""`/v1/queue/actions`: hold, release, cancel or retry now the mail an email-log search matches."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import json_body
from engine.sending import queue_actions
from engine.sending.queue_actions import Action

blueprint = Blueprint("queue", __name__, url_prefix="/v1/queue")


class QueueAction(In):
    q: str = Field(max_length=1000)
    action: Action
    dry_run: bool = False


class QueueActionOut(BaseModel):
    action: str
    dry_run: bool
    emails: int  # emails with a recipient it took (dry run: would take)
    recipients: int


@blueprint.post("/actions")
@json_body(QueueAction)
@document_response(QueueActionOut)
async def act(body: QueueAction) -> dict[str, Any]:
    touched = await queue_actions.act(runtime(), principal(), body.q, body.action, body.dry_run)
    out = QueueActionOut(
        action=body.action,
        dry_run=body.dry_run,
        emails=touched.emails,
        recipients=touched.recipients,
    )
    return out.model_dump()
