"""`/v1/sandbox`: sandbox mode, domains verified without DNS, test keys, the captured mail and
requests, scripted outcomes still to come (and fast-forwarding them), and inbound mail
injected into the workspace's forwards.

In sandbox mode the workspace's mail is captured instead of delivered and each recipient's
local part scripts what happens (engine/sandbox/scripts.py); the mailbox lists what was
captured, with the signed message, its header fields, parts and DKIM result. Webhook
deliveries and forwards to URLs are captured too, never sent: `requests` lists each POST
with its URL, header fields (the signature among them) and body.
"""

from __future__ import annotations

import base64
import uuid
from datetime import datetime

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In, Name, Out, PageQuery
from api.routes.api_keys import ApiKeyCreated
from api.routes.domains import DomainOut, render
from api.validation import json_body, query_args
from engine.sandbox import inbound, keys, mailbox, mode, outcomes, posts, scripts
from storage.sandbox import Captured, CapturedPost

blueprint = Blueprint("sandbox", __name__, url_prefix="/v1/sandbox")


class ScriptOut(BaseModel):
    local_part: str
    description: str


class SandboxOut(BaseModel):
    enabled: bool
    sandbox_verified_domains: list[str]
    scripts: list[ScriptOut]


class SwitchSandbox(In):
    enabled: bool


class CreateTestKey(In):
    name: Name


class MessageQuery(PageQuery):
    email_id: uuid.UUID | None = None


class CapturedOut(Out):
    id: str
    email_id: str
    envelope_from: str
    recipients: list[str]
    subject: str
    dkim: str
    created_at: datetime


class CapturedPage(BaseModel):
    items: list[CapturedOut]
    total: int
    page: int
    limit: int


class HeaderOut(BaseModel):
    name: str
    value: str


class CapturedDetailOut(CapturedOut):
    headers: list[HeaderOut]
    text: str | None
    html: str | None
    size: int
    source_base64: str = Field(description="the message exactly as captured, signed")


def _state(found: mode.SandboxState) -> dict[str, object]:
    return SandboxOut(
        enabled=found.enabled,
        sandbox_verified_domains=found.sandbox_verified_domains,
        scripts=[
            ScriptOut(local_part=s.local_part, description=s.description) for s in scripts.SCRIPTS
        ],
    ).model_dump()


@blueprint.get("")
@document_response(SandboxOut)
async def status() -> dict[str, object]:
    return _state(await mode.state(runtime(), principal()))


@blueprint.put("")
@json_body(SwitchSandbox)
@document_response(SandboxOut)
async def switch(body: SwitchSandbox) -> dict[str, object]:
    return _state(await mode.switch(runtime(), principal(), body.enabled))


@blueprint.post("/domains/<id:domain_id>/verify")
@document_response(DomainOut)
async def mark_verified(domain_id: str) -> dict[str, object]:
    return render(await mode.mark_verified(runtime(), principal(), domain_id))


@blueprint.post("/test-keys")
@json_body(CreateTestKey)
@document_response(ApiKeyCreated, 201)
async def create_test_key(body: CreateTestKey) -> tuple[dict[str, object], int]:
    created = await keys.create(runtime(), principal(), body.name)
    key = created.key
    out = ApiKeyCreated(
        id=key.id,
        name=key.name,
        key=created.raw,
        key_prefix=key.key_prefix,
        permissions=list(key.permissions),
        created_at=key.created_at,
    )
    return out.model_dump(mode="json"), 201


def _summary(captured: Captured) -> CapturedOut:
    return CapturedOut.model_validate(captured)


@blueprint.get("/messages")
@query_args(MessageQuery)
@document_response(CapturedPage)
async def messages(query: MessageQuery) -> dict[str, object]:
    email_id = None if query.email_id is None else str(query.email_id)
    found, total = await mailbox.page(runtime(), principal(), email_id, query.page, query.limit)
    page = CapturedPage(
        items=[_summary(c) for c in found], total=total, page=query.page, limit=query.limit
    )
    return page.model_dump(mode="json")


@blueprint.get("/messages/<id:message_id>")
@document_response(CapturedDetailOut)
async def message(message_id: str) -> dict[str, object]:
    found = await mailbox.message(runtime(), principal(), message_id)
    out = CapturedDetailOut(
        **_summary(found.captured).model_dump(),
        headers=[HeaderOut(name=n, value=v) for n, v in found.headers],
        text=found.text,
        html=found.html,
        size=len(found.source),
        source_base64=base64.b64encode(found.source).decode(),
    )
    return out.model_dump(mode="json")


@blueprint.get("/messages/<id:message_id>/source")
async def source(message_id: str) -> Response:
    found = await mailbox.message(runtime(), principal(), message_id)
    return Response(found.source, content_type="message/rfc822")


class OutcomeQuery(In):
    email_id: uuid.UUID | None = None


class PendingOutcomeOut(Out):
    id: str
    email_id: str
    recipient: str
    kind: str = Field(description="complaint, open or click")
    due_at: datetime


class FastForward(In):
    email_id: uuid.UUID | None = Field(None, description="only this email's; all when left out")


class FastForwarded(BaseModel):
    fast_forwarded: int = Field(description="outcomes made due now; they happen within 15 s")


@blueprint.get("/outcomes")
@query_args(OutcomeQuery)
@document_response(list[PendingOutcomeOut])
async def pending_outcomes(query: OutcomeQuery) -> list[dict[str, object]]:
    """Scripted outcomes still to come (`complain-after-1h@` and the like), soonest first."""
    email_id = None if query.email_id is None else str(query.email_id)
    found = await outcomes.pending(runtime(), principal(), email_id)
    return [PendingOutcomeOut.model_validate(o).model_dump(mode="json") for o in found]


@blueprint.post("/outcomes/fast-forward")
@json_body(FastForward)
@document_response(FastForwarded)
async def fast_forward(body: FastForward) -> dict[str, object]:
    """Make pending scripted outcomes due now instead of waiting for their time."""
    email_id = None if body.email_id is None else str(body.email_id)
    return {"fast_forwarded": await outcomes.fast_forward(runtime(), principal(), email_id)}


class InjectInbound(In):
    to: EmailText = Field(description="the source address of one of the workspace's forwards")
    from_address: EmailText = "someone@sandbox.example"
    subject: str = Field("A message from the sandbox", max_length=998)
    text: str = Field("Sent into a forward from the sandbox.", max_length=100_000)


class Injected(BaseModel):
    forward_id: str


@blueprint.post("/inbound")
@json_body(InjectInbound)
@document_response(Injected, 202)
async def inject_inbound(body: InjectInbound) -> tuple[dict[str, object], int]:
    """Hand a message to the workspace's forwarding rules as if the inbound MX server had
    accepted it (sandbox mode only): its copies are captured like the rest of its mail."""
    injection = inbound.Injection(body.to, body.from_address, body.subject, body.text)
    return {"forward_id": await inbound.inject(runtime(), principal(), injection)}, 202


class CapturedRequestOut(Out):
    id: str
    kind: str = Field(description="webhook or forward")
    source_id: str = Field(description="the webhook delivery, or the forward job")
    url: str
    created_at: datetime


class CapturedRequestPage(BaseModel):
    items: list[CapturedRequestOut]
    total: int
    page: int
    limit: int


class CapturedRequestDetailOut(CapturedRequestOut):
    headers: list[HeaderOut]
    signature: str | None = Field(description="X-Webhook-Signature, when it carries one")
    body: str = Field(description="the body exactly as it would have been sent")


def _request(post: CapturedPost) -> CapturedRequestOut:
    return CapturedRequestOut.model_validate(post)


@blueprint.get("/requests")
@query_args(PageQuery)
@document_response(CapturedRequestPage)
async def captured_requests(query: PageQuery) -> dict[str, object]:
    found, total = await posts.page(runtime(), principal(), query.page, query.limit)
    page = CapturedRequestPage(
        items=[_request(p) for p in found], total=total, page=query.page, limit=query.limit
    )
    return page.model_dump(mode="json")


@blueprint.get("/requests/<id:request_id>")
@document_response(CapturedRequestDetailOut)
async def captured_request(request_id: str) -> dict[str, object]:
    found = await posts.request(runtime(), principal(), request_id)
    out = CapturedRequestDetailOut(
        **_request(found.post).model_dump(),
        headers=[HeaderOut(name=n, value=v) for n, v in found.post.headers],
        signature=found.signature,
        body=found.body,
    )
    return out.model_dump(mode="json")
