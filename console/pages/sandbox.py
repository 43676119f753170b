"""The sandbox: the workspace's mode (switch), the addresses that script outcomes, the
mailbox of captured messages, each with its HTML (in a sandboxed frame), text, header
fields, signed source and DKIM result, and the captured webhook and forward POSTs, each
with its URL, header fields (the signature among them) and body; scripted outcomes still to
come (fast-forwarded on request), and a form that hands a message to a forward as if it
had come in by MX."""

from __future__ import annotations

from pydantic import BaseModel
from quart import Blueprint, Response, request

from api.errors import status_of
from console.web import form, framed_html, go, page, parse, problems_of, rt, who
from engine.forwarding import rules
from engine.platform.errors import EngineError
from engine.sandbox import inbound, mailbox, mode, outcomes, posts, scripts

blueprint = Blueprint("sandbox", __name__)

PAGE_SIZE = 25
DONE = {
    "on": "This workspace is in sandbox mode: its mail is captured, never delivered.",
    "off": "This workspace left the sandbox: its mail is delivered for real.",
    "injected": "The message was handed to the forward: its copies show in the log and here.",
    "fast_forwarded": "The scripted outcomes are due now: they happen within 15 seconds.",
}


class _Inbound(BaseModel):
    """The inbound form's fields (engine/sandbox/inbound.py)."""

    to: str = ""
    from_address: str = ""
    subject: str = ""
    text: str = ""


@blueprint.get("/sandbox")
async def index(
    status: int = 200,
    problems: dict[str, str] | None = None,
    inbound_form: dict[str, str] | None = None,
) -> Response:
    runtime, principal = rt(), who()
    page_number = max(0, request.args.get("page", 0, type=int) or 0)
    found, total = await mailbox.page(runtime, principal, None, page_number, PAGE_SIZE)
    captured_requests, requests_total = await posts.page(runtime, principal, 0, PAGE_SIZE)
    return await page(
        "sandbox.html",
        status=status,
        title="Sandbox",
        state=await mode.state(runtime, principal),
        scripts=scripts.SCRIPTS,
        messages=found,
        total=total,
        page_number=page_number,
        more=(page_number + 1) * PAGE_SIZE < total,
        requests=captured_requests,
        requests_total=requests_total,
        forwards=[f for f in await rules.list_all(runtime, principal) if f.is_active],
        pending=await outcomes.pending(runtime, principal, None),
        inbound_form=inbound_form or {},
        problems=problems or {},
        notice=DONE.get(request.args.get("done", "")),
    )


@blueprint.post("/sandbox")
async def switch() -> Response:
    on = (await form()).get("enabled") == "on"
    try:
        await mode.switch(rt(), who(), on)
    except EngineError as exc:
        return await index(status_of(exc), problems_of(exc))
    return go("console.sandbox.index", done="on" if on else "off")


@blueprint.post("/sandbox/inbound")
async def inject() -> Response:
    values = await form()
    fields, _ = parse(_Inbound, values)
    fields = fields or _Inbound()
    injection = inbound.Injection(
        fields.to,
        fields.from_address or "someone@sandbox.example",
        fields.subject or "A message from the sandbox",
        fields.text or "Sent into a forward from the sandbox.",
    )
    try:
        await inbound.inject(rt(), who(), injection)
    except EngineError as exc:
        return await index(status_of(exc), problems_of(exc), values)
    return go("console.sandbox.index", done="injected")


@blueprint.post("/sandbox/fast-forward")
async def fast_forward() -> Response:
    await outcomes.fast_forward(rt(), who(), None)
    return go("console.sandbox.index", done="fast_forwarded")


@blueprint.get("/sandbox/<id:message_id>")
async def message(message_id: str) -> Response:
    found = await mailbox.message(rt(), who(), message_id)
    return await page("sandbox_message.html", title=found.captured.subject, found=found)


@blueprint.get("/sandbox/<id:message_id>/html")
async def html(message_id: str) -> Response:
    """The captured HTML part as a document of its own, for the sandboxed frame."""
    found = await mailbox.message(rt(), who(), message_id)
    return framed_html(found.html or "")


@blueprint.get("/sandbox/<id:message_id>/source")
async def source(message_id: str) -> Response:
    found = await mailbox.message(rt(), who(), message_id)
    return Response(found.source, content_type="text/plain; charset=utf-8")


@blueprint.get("/sandbox/requests/<id:request_id>")
async def captured_request(request_id: str) -> Response:
    found = await posts.request(rt(), who(), request_id)
    return await page("sandbox_request.html", title=f"Captured {found.post.kind} POST", found=found)
