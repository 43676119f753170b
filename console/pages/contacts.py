"""Contacts and broadcasts: lists, their contacts, CSV upload (with upload progress), bulk send
with a preview of one rendered message, each broadcast's progress while it sends, and resuming
one the complaint-rate guard paused.

The send form carries an Idempotency-Key made when the page was drawn, so a form sent twice
(a double click, a reload) queues the broadcast once: the API's rule (engine/sending/
idempotency.py) answers the second time with the first result.
"""

from __future__ import annotations

import uuid
from typing import Any

from pydantic import BaseModel
from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.contacts import AddContact, BulkSendBody, CreateList
from console.web import form, framed_html, go, page, parse, problems_of, rt, who
from engine import mail_stats
from engine.contacts import bulk_send, complaint_guard, csv_import, preview
from engine.contacts import lists as contacts
from engine.domains import registry, senders
from engine.platform.errors import EngineError, InvalidRequest
from engine.sending import idempotency

blueprint = Blueprint("contacts", __name__)

PAGE_SIZE = 50
DONE = {
    "created": "List created.",
    "added": "Contact added.",
    "removed": "Contact removed.",
    "deleted": "List deleted.",
}
RESUMED = "Broadcast resumed: its held mail goes now."


async def _index(status: int = 200, **extra: Any) -> Response:
    found = await contacts.list_lists(rt(), who())
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "contacts.html",
        status=status,
        title="Contacts",
        lists=found,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/contacts")
async def index() -> Response:
    return await _index()


@blueprint.post("/contacts")
async def create() -> Response:
    values = await form()
    body, problems = parse(CreateList, values)
    if body is None:
        return await _index(422, values=values, problems=problems)
    try:
        created = await contacts.create_list(rt(), who(), body.name, body.description, None)
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.contacts.detail", list_id=created.id, done="created")


async def _sendable_senders() -> list[Any]:
    """The senders mail can go from: active, on a verified domain."""
    runtime, principal = rt(), who()
    verified = {d.id for d in await registry.list_all(runtime, principal) if d.status == "verified"}
    return [
        s
        for s in await senders.list_all(runtime, principal)
        if s.is_active and s.domain_id in verified
    ]


async def _detail(list_id: str, status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    page_number = max(0, request.args.get("page", 0, type=int) or 0)
    found = await contacts.read_list(runtime, principal, list_id, page_number, PAGE_SIZE)
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    extra.setdefault("send", {})
    return await page(
        "contact_list.html",
        status=status,
        title=found.contact_list.name,
        found=found,
        page_number=page_number,
        more=len(found.contacts) == PAGE_SIZE,
        senders=await _sendable_senders(),
        idempotency_key=str(uuid.uuid4()),
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/contacts/<id:list_id>")
async def detail(list_id: str) -> Response:
    return await _detail(list_id)


@blueprint.post("/contacts/<id:list_id>/contacts")
async def add_contact(list_id: str) -> Response:
    values = await form()
    body, problems = parse(AddContact, {k: v for k, v in values.items() if v})
    if body is None:
        return await _detail(list_id, 422, values=values, problems=problems)
    try:
        await contacts.add_contact(rt(), who(), list_id, body.email, body.name, None)
    except EngineError as exc:
        return await _detail(list_id, status_of(exc), values=values, problems=problems_of(exc))
    return go("console.contacts.detail", list_id=list_id, done="added")


@blueprint.post("/contacts/<id:list_id>/contacts/<id:contact_id>/delete")
async def remove_contact(list_id: str, contact_id: str) -> Response:
    await contacts.remove_contact(rt(), who(), list_id, contact_id)
    return go("console.contacts.detail", list_id=list_id, done="removed")


@blueprint.post("/contacts/<id:list_id>/delete")
async def delete(list_id: str) -> Response:
    await contacts.delete_list(rt(), who(), list_id)
    return go("console.contacts.index", done="deleted")


@blueprint.post("/contacts/<id:list_id>/upload")
async def upload(list_id: str) -> Response:
    files = await request.files
    chosen = files.get("file")
    try:
        if chosen is None or not chosen.filename:
            raise InvalidRequest("choose a CSV file to upload", code="no_file")
        result = await csv_import.import_csv(rt(), who(), list_id, chosen.stream)
    except EngineError as exc:
        if request.headers.get("HX-Request") == "true":
            return await page("_import_result.html", status=status_of(exc), problem=exc.detail)
        return await _detail(list_id, status_of(exc), problems={"file": exc.detail})
    if request.headers.get("HX-Request") == "true":
        return await page("_import_result.html", result=result, list_id=list_id)
    return await _detail(list_id, imported=result)


class _BulkForm(BaseModel):
    """The send form's fields, before they become the API's bulk-send body."""

    sender_address_id: str = ""
    subject: str = ""
    html: str = ""
    text: str = ""
    tags: str = ""

    def body(self, list_id: str) -> dict[str, Any]:
        return {
            "contact_list_id": list_id,
            "sender_address_id": self.sender_address_id,
            "subject": self.subject,
            "html": self.html or None,
            "text": self.text or None,
            "tags": [t.strip() for t in self.tags.split(",") if t.strip()],
        }


@blueprint.post("/contacts/<id:list_id>/preview")
async def preview_send(list_id: str) -> Response:
    fields, _ = parse(_BulkForm, await form())
    fields = fields or _BulkForm()
    shown = await preview.first_message(
        rt(), who(), list_id, fields.subject, fields.html or None, fields.text or None
    )
    return await page("_send_preview.html", shown=shown)


@blueprint.post("/contacts/<id:list_id>/preview.html")
async def preview_html(list_id: str) -> Response:
    """The first contact's message's HTML as a document of its own: the send form posts into
    the preview's sandboxed frames (the HTML is the form's, too long for a frame's URL)."""
    fields, _ = parse(_BulkForm, await form())
    fields = fields or _BulkForm()
    shown = await preview.first_message(
        rt(), who(), list_id, fields.subject, fields.html or None, fields.text or None
    )
    return framed_html("" if shown is None else shown.html or "")


@blueprint.post("/contacts/<id:list_id>/send")
async def send(list_id: str) -> Response:
    values = await form()
    fields, _ = parse(_BulkForm, values)
    body, problems = parse(BulkSendBody, (fields or _BulkForm()).body(list_id))
    if body is not None and not (body.html or body.text):
        problems = {"html": "write an HTML or a text body"}
    if body is None or problems:
        return await _detail(list_id, 422, send=values, problems=problems)
    req = bulk_send.BulkSendRequest(
        contact_list_id=str(body.contact_list_id),
        sender_address_id=str(body.sender_address_id),
        subject=body.subject,
        html=body.html,
        text=body.text,
        tags=tuple(body.tags),
    )
    runtime, principal = rt(), who()

    async def run() -> tuple[Any, int]:
        result = await bulk_send.send_to_list(runtime, principal, list_id, req)
        return {"broadcast_id": result.broadcast_id}, 200

    key = values.get("idempotency_key") or str(uuid.uuid4())
    digest = idempotency.request_hash("POST", request.path, body.model_dump_json().encode())
    try:
        sent, _ = await idempotency.once(runtime, principal, key[:256], digest, run)
    except EngineError as exc:
        return await _detail(list_id, status_of(exc), send=values, problems=problems_of(exc))
    return go("console.contacts.broadcast", broadcast_id=sent["broadcast_id"])


@blueprint.get("/broadcasts")
async def broadcasts() -> Response:
    page_number = max(0, request.args.get("page", 0, type=int) or 0)
    found = await bulk_send.broadcasts_page(rt(), who(), page_number, PAGE_SIZE)
    template = (
        "_broadcasts_table.html"
        if request.headers.get("HX-Request") == "true"
        else "broadcasts.html"
    )
    sending = any(b.status == "sending" for b in found)
    return await page(
        template, title="Broadcasts", broadcasts=found, sending=sending, page_number=page_number
    )


async def _broadcast(broadcast_id: str, status: int = 200, **extra: Any) -> Response:
    found = await bulk_send.broadcast(rt(), who(), broadcast_id)
    figures = await mail_stats.of_broadcast(rt(), who(), broadcast_id)
    lists = {c.id: c for c in await contacts.list_lists(rt(), who())}
    template = (
        "_broadcast_progress.html"
        if request.headers.get("HX-Request") == "true"
        else "broadcast.html"
    )
    extra.setdefault("notice", RESUMED if request.args.get("done") == "resumed" else None)
    return await page(
        template,
        status=status,
        title=found.name,
        broadcast=found,
        figures=figures,
        contact_list=lists.get(found.contact_list_id),
        **extra,
    )


@blueprint.get("/broadcasts/<id:broadcast_id>")
async def broadcast(broadcast_id: str) -> Response:
    return await _broadcast(broadcast_id)


@blueprint.post("/broadcasts/<id:broadcast_id>/resume")
async def resume_broadcast(broadcast_id: str) -> Response:
    """Resume a paused broadcast, under the API's rules and refusals (409 `not_paused`,
    `marketing_stopped`)."""
    try:
        await complaint_guard.resume(rt(), who(), broadcast_id)
    except EngineError as exc:
        return await _broadcast(broadcast_id, status_of(exc), problems=problems_of(exc))
    return go("console.contacts.broadcast", broadcast_id=broadcast_id, done="resumed")
