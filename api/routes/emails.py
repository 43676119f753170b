"""`/v1/emails/`: send, validate, the email log (filtered by search words, status, tag, source
and creation range, its total in `X-Total-Count`, exported as CSV), one email with its
events, retry."""

from __future__ import annotations

import csv
import io
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, Field, RootModel, model_validator
from quart import Blueprint, Response, request
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In, Out, PageQuery, Tag
from api.validation import json_body, problem_message, query_args
from engine.platform.errors import EngineError, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sending import batch, email_log, idempotency, scheduling, statuses
from engine.sending import intake as sending
from engine.sending.intake import AttachmentIn, Mailbox, SendRequest, SendResult
from engine.templates import library as templates
from storage.emails import Email, Search

blueprint = Blueprint("emails", __name__, url_prefix="/v1/emails")

STATUSES = statuses.EMAIL_STATUSES


@dataclass(frozen=True, slots=True)
class Sent:
    """What of a sending request besides its body the answer depends on."""

    method: str
    path: str
    idempotency_key: str | None  # the header as sent


class Address(In):
    email: EmailText
    name: str | None = Field(None, max_length=200)


class Attachment(In):
    filename: str = Field(min_length=1, max_length=255)
    content_base64: str
    content_type: str = Field("application/octet-stream", max_length=200)


class SendBody(In):
    from_: Address
    to: list[Address] = Field(max_length=50)
    subject: str = Field(max_length=998)
    html: str | None = None
    text: str | None = None
    cc: list[Address] = Field(default_factory=list, max_length=50)
    bcc: list[Address] = Field(default_factory=list, max_length=50)
    reply_to: Address | None = None
    headers: dict[str, str] = Field(default_factory=dict, max_length=50)
    tags: list[Tag] = Field(default_factory=list, max_length=20)
    send_at: datetime | None = None
    attachments: list[Attachment] = Field(default_factory=list, max_length=100)
    # A template (Starter and above) fills the subject, html and text the body leaves out,
    # rendered with `variables`.
    template_id: uuid.UUID | None = None
    variables: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, max_length=100
    )
    # Transactional mail carries no List-Unsubscribe unless asked; asked, it carries the
    # one-click header, `{{unsubscribe_url}}` and the footer, and an unsubscribed address is
    # not sent it (engine/suppressions/scopes.py).
    unsubscribe: bool = False

    @model_validator(mode="before")
    @classmethod
    def subject_from_template(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("template_id") is not None:
            return {"subject": "", **data}
        return data

    def to_request(self) -> SendRequest:
        def box(a: Address) -> Mailbox:
            return Mailbox(a.email, a.name)

        return SendRequest(
            from_=box(self.from_),
            to=tuple(box(a) for a in self.to),
            subject=self.subject,
            html=self.html,
            text=self.text,
            cc=tuple(box(a) for a in self.cc),
            bcc=tuple(box(a) for a in self.bcc),
            reply_to=None if self.reply_to is None else box(self.reply_to),
            headers=self.headers,
            tags=tuple(self.tags),
            send_at=self.send_at,
            attachments=tuple(
                AttachmentIn(a.filename, a.content_base64, a.content_type) for a in self.attachments
            ),
            unsubscribe=self.unsubscribe,
        )


class SendResponse(BaseModel):
    id: str
    status: str
    message_id: str
    rejection_reason: str | None


class IssueOut(BaseModel):
    field: str
    error: str


class ValidationOut(BaseModel):
    valid: bool
    can_send: bool
    issues: list[IssueOut]


class EmailItem(Out):
    id: str
    from_address: str
    to_addresses: list[str]
    subject: str
    status: str
    tags: list[str]
    source: str
    created_at: datetime
    delivered_at: datetime | None


class EventOut(Out):
    event_type: str
    recipient: str | None
    metadata: dict[str, Any] | None
    created_at: datetime


class RecipientOut(Out):
    address: str
    kind: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_response: str | None


class EmailDetailOut(EmailItem):
    from_name: str | None
    cc: list[dict[str, Any]]
    bcc: list[dict[str, Any]]
    reply_to: dict[str, Any] | None
    html: str | None
    text: str | None
    headers: dict[str, str]
    attachments: list[dict[str, Any]]
    message_id: str
    rejection_reason: str | None
    retry_of_id: str | None
    send_at: datetime | None
    unsubscribe: bool  # carries List-Unsubscribe and the unsubscribe link
    recipients: list[RecipientOut]
    events: list[EventOut]


class LogFilters(In):
    """The email log's filters besides its search words: where emails came from and when
    they were created (`created_from` inclusive, `created_before` exclusive; a time without
    a zone is UTC)."""

    source: str | None = Field(None, max_length=50)
    created_from: datetime | None = None
    created_before: datetime | None = None

    def filtered(self, q: str = "", status: str | None = None, tag: str | None = None) -> Search:
        return email_log.parse_query(
            q,
            status,
            tag,
            source=self.source,
            created_from=self.created_from,
            created_before=self.created_before,
        )


class ListQuery(PageQuery, LogFilters):
    status: Literal[STATUSES] | None = None  # type: ignore[valid-type]


def _counted(found: list[Email], total: int) -> tuple[list[dict[str, Any]], int, dict[str, str]]:
    """A page of the log with the number of emails matching in all, in `X-Total-Count`: the
    body stays the array it always was."""
    return [_item(e) for e in found], 200, {"X-Total-Count": str(total)}


def _send_response(result: SendResult) -> dict[str, Any]:
    return SendResponse(
        id=result.id,
        status=result.status,
        message_id=result.message_id,
        rejection_reason=result.rejection_reason,
    ).model_dump(mode="json")


def _item(email: Email) -> dict[str, Any]:
    return EmailItem(
        id=email.id,
        from_address=email.from_address,
        to_addresses=[t["email"] for t in email.to],
        subject=email.subject,
        status=email.status,
        tags=email.tags,
        source=email.source,
        created_at=email.created_at,
        delivered_at=email.delivered_at,
    ).model_dump(mode="json")


def idempotency_key(value: str | None) -> str | None:
    """The request's Idempotency-Key header, None without one; 422 unless 1-256 printable
    ASCII characters."""
    if value is not None and not (1 <= len(value) <= 256 and all(" " <= c <= "~" for c in value)):
        raise Unprocessable(
            "Idempotency-Key must be 1-256 printable ASCII characters",
            errors=[{"loc": ["header", "Idempotency-Key"], "msg": "1-256 printable characters"}],
        )
    return value


async def _request(rt: Runtime, who: Principal, body: SendBody) -> SendRequest:
    """The body as a send request; with template_id, completed from the template."""
    req = body.to_request()
    if body.template_id is None:
        return req
    return await templates.fill(rt, who, req, str(body.template_id), body.variables)


async def once_per_key(
    rt: Runtime,
    who: Principal,
    sent: Sent,
    body: pydantic.BaseModel,
    run: Callable[[], Awaitable[tuple[Any, int]]],
) -> tuple[Any, int]:
    """Run a sending request, or replay its first response when its Idempotency-Key (in
    `sent`) was seen with the same method, path and body."""
    key = idempotency_key(sent.idempotency_key)
    if key is None:
        return await run()
    digest = idempotency.request_hash(sent.method, sent.path, body.model_dump_json().encode())
    return await idempotency.once(rt, who, key, digest, run)


def _sent() -> Sent:
    """The request Quart is serving, as `Sent`."""
    return Sent(request.method, request.path, request.headers.get("Idempotency-Key"))


async def at_most_once(
    body: pydantic.BaseModel, run: Callable[[], Awaitable[tuple[Any, int]]]
) -> tuple[Any, int]:
    """`once_per_key` for the request Quart is serving."""
    return await once_per_key(runtime(), principal(), _sent(), body, run)


async def accept(rt: Runtime, who: Principal, sent: Sent, body: SendBody) -> tuple[Any, int]:
    """`POST /v1/emails/` once authenticated and its body parsed: the response and its status.
    The route below and the ASGI edge (api/send_edge.py) both answer with this."""

    async def run() -> tuple[Any, int]:
        return _send_response(await sending.send(rt, who, await _request(rt, who, body))), 202

    return await once_per_key(rt, who, sent, body, run)


@blueprint.post("/")
@json_body(SendBody)
@document_response(SendResponse, 202)
async def send(body: SendBody) -> tuple[dict[str, Any], int]:
    response, status = await accept(runtime(), principal(), _sent(), body)
    return response, status


@blueprint.post("/validate")
@json_body(SendBody)
@document_response(ValidationOut)
async def validate(body: SendBody) -> dict[str, Any]:
    checked = await sending.validate(
        runtime(), principal(), await _request(runtime(), principal(), body)
    )
    return ValidationOut(
        valid=checked.valid,
        can_send=checked.can_send,
        issues=[IssueOut(field=i.field, error=i.error) for i in checked.issues],
    ).model_dump(mode="json")


class ExportQuery(LogFilters):
    q: str = Field("", max_length=1000)
    status: str | None = Field(None, max_length=50)
    tag: Tag | None = None

    def search(self) -> Search:
        return self.filtered(self.q, self.status, self.tag)


class SearchQuery(PageQuery, ExportQuery):
    pass


class UpdatesQuery(In):
    since: datetime


@blueprint.get("/search")
@query_args(SearchQuery)
@document_response(list[EmailItem])
async def search(query: SearchQuery) -> tuple[list[dict[str, Any]], int, dict[str, str]]:
    wanted = query.search()
    found = await email_log.search(runtime(), principal(), wanted, query.page, query.limit)
    return _counted(found, await email_log.count(runtime(), principal(), wanted))


CSV_COLUMNS = ("id", "created_at", "status", "source", "from", "to", "subject", "tags")


def _csv_cell(value: str) -> str:
    """A cell a spreadsheet shows as text: one starting with `=`, `+`, `-`, `@`, a tab or a
    carriage return would be read as a formula (OWASP's CSV injection), so it gets a
    leading apostrophe."""
    return "'" + value if value[:1] in ("=", "+", "-", "@", "\t", "\r") else value


def _csv_line(cells: Sequence[str]) -> bytes:
    out = io.StringIO()
    csv.writer(out).writerow([_csv_cell(c) for c in cells])
    return out.getvalue().encode()


async def export_csv(rt: Runtime, who: Principal, wanted: Search) -> Response:
    """The emails matching a search as a CSV download, newest first, written as it is read;
    at most email_log.EXPORT_LIMIT rows, the number matching in `X-Total-Count`. The API's
    export and the console's answer with this."""
    total = await email_log.count(rt, who, wanted)

    async def rows() -> AsyncIterator[bytes]:
        yield _csv_line(CSV_COLUMNS)
        async for e in email_log.export(rt, who, wanted):
            to = ", ".join(t["email"] for t in e.to)
            when = e.created_at.isoformat()
            yield _csv_line(
                (e.id, when, e.status, e.source, e.from_address, to, e.subject, ", ".join(e.tags))
            )

    return Response(
        rows(),
        content_type="text/csv; charset=utf-8",
        headers={
            "Content-Disposition": 'attachment; filename="emails.csv"',
            "X-Total-Count": str(total),
            "X-Row-Limit": str(email_log.EXPORT_LIMIT),
        },
    )


@blueprint.get("/export")
@query_args(ExportQuery)
async def export(query: ExportQuery) -> Response:
    """The email log as CSV (columns id, created_at, status, source, from, to, subject,
    tags), with the search's filters, newest first, at most 50,000 rows."""
    return await export_csv(runtime(), principal(), query.search())


@blueprint.get("/updates")
@query_args(UpdatesQuery)
@document_response(list[EmailItem])
async def updates(query: UpdatesQuery) -> tuple[list[dict[str, Any]], int, dict[str, str]]:
    """The changes after `since` that are at least 5 s old (a change can commit a moment
    after its time: the feed waits for it rather than skip it); `X-Next-Since` is the `since`
    of the changes after these (the last one's time, to the microsecond): the body stays the
    array of list items."""
    since = query.since if query.since.tzinfo else query.since.replace(tzinfo=UTC)
    found = await email_log.updates(runtime(), principal(), since)
    upto = found[-1].updated_at if found else since
    next_since = upto.astimezone(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
    return [_item(e) for e in found], 200, {"X-Next-Since": next_since}


class BatchBody(RootModel[list[dict[str, Any]]]):
    """A JSON array of send bodies; each is validated on its own."""


class BatchEntryOut(BaseModel):
    id: str | None
    status: str
    message_id: str | None
    rejection_reason: str | None


class SavedSearch(In):
    id: str = Field(default_factory=lambda: str(uuid.uuid4()), max_length=64)
    name: str = Field(min_length=1, max_length=100)
    query: str = Field("", max_length=1000)
    range: str | None = Field(None, max_length=20)
    status: str | None = Field(None, max_length=50)
    domain: str | None = Field(None, max_length=253)
    source: str | None = Field(None, max_length=50)
    # The log's date filters (LogFilters), kept as given: a day stays a day.
    created_from: date | datetime | None = None
    created_before: date | datetime | None = None

    def stored(self) -> dict[str, Any]:
        """As kept and listed: JSON values (a day as YYYY-MM-DD, a time in ISO 8601)."""
        return self.model_dump(mode="json")


class SavedSearches(In):
    searches: list[SavedSearch] = Field(max_length=50)


async def _parse_entry(entry: dict[str, Any]) -> SendRequest | str:
    try:
        return await _request(runtime(), principal(), SendBody.model_validate(entry))
    except pydantic.ValidationError as exc:
        first = exc.errors()[0]
        return f"{'.'.join(str(p) for p in first['loc'])}: {problem_message(first, SendBody)}"
    except EngineError as exc:  # the entry's template is unknown or not available
        return exc.detail


@blueprint.post("/batch")
@json_body(BatchBody)
@document_response(list[BatchEntryOut], 202)
async def send_batch(body: BatchBody) -> tuple[list[dict[str, Any]], int]:
    who = principal()
    batch.check_size(who, len(body.root))  # before parsing every entry of an oversized batch

    async def run() -> tuple[Any, int]:
        entries = await batch.send_batch(runtime(), who, [await _parse_entry(e) for e in body.root])
        out = [
            BatchEntryOut(id=None, status="error", message_id=None, rejection_reason=e.error)
            if e.result is None
            else BatchEntryOut(**_send_response(e.result))
            for e in entries
        ]
        return [o.model_dump(mode="json") for o in out], 202

    response, status = await at_most_once(body, run)
    return response, status


@blueprint.get("/saved-searches")
@document_response(SavedSearches)
async def saved_searches() -> dict[str, Any]:
    found = await email_log.saved_searches(runtime(), principal())
    return {"searches": found}


@blueprint.put("/saved-searches")
@json_body(SavedSearches)
@document_response(SavedSearches)
async def replace_saved_searches(body: SavedSearches) -> dict[str, Any]:
    searches = [s.stored() for s in body.searches]
    await email_log.replace_saved_searches(runtime(), principal(), searches)
    return {"searches": searches}


class ScheduledItem(EmailItem):
    send_at: datetime | None


class Cancelled(BaseModel):
    id: str
    status: str


@blueprint.get("/scheduled")
@document_response(list[ScheduledItem])
async def list_scheduled() -> list[dict[str, Any]]:
    found = await scheduling.scheduled(runtime(), principal())
    return [ScheduledItem(**_item(e), send_at=e.send_at).model_dump(mode="json") for e in found]


@blueprint.post("/<id:email_id>/cancel")
@document_response(Cancelled)
async def cancel(email_id: str) -> dict[str, Any]:
    await scheduling.cancel(runtime(), principal(), email_id)
    return Cancelled(id=email_id, status="cancelled").model_dump()


@blueprint.post("/<id:email_id>/send-now")
@document_response(SendResponse)
async def send_now(email_id: str) -> dict[str, Any]:
    return _send_response(await scheduling.send_now(runtime(), principal(), email_id))


@blueprint.get("/")
@query_args(ListQuery)
@document_response(list[EmailItem])
async def list_emails(query: ListQuery) -> tuple[list[dict[str, Any]], int, dict[str, str]]:
    wanted = query.filtered(status=query.status)
    found = await email_log.search(runtime(), principal(), wanted, query.page, query.limit)
    return _counted(found, await email_log.count(runtime(), principal(), wanted))


@blueprint.get("/<id:email_id>")
@document_response(EmailDetailOut)
async def get(email_id: str) -> dict[str, Any]:
    found = await email_log.detail(runtime(), principal(), email_id)
    email = found.email
    out = EmailDetailOut(
        **_item(email),
        from_name=email.from_name,
        cc=email.cc,
        bcc=email.bcc,
        reply_to=email.reply_to,
        html=email.html,
        text=email.text,
        headers=email.headers,
        attachments=[
            {"filename": a["filename"], "content_type": a["content_type"]}
            for a in email.attachments
        ],
        message_id=email.message_id,
        rejection_reason=email.rejection_reason,
        retry_of_id=email.retry_of_id,
        send_at=email.send_at,
        unsubscribe=email.unsubscribe,
        recipients=[RecipientOut.model_validate(r) for r in found.recipients],
        events=[EventOut.model_validate(e) for e in found.events],
    )
    return out.model_dump(mode="json")


@blueprint.get("/<id:email_id>/events")
@document_response(list[EventOut])
async def events(email_id: str) -> list[dict[str, Any]]:
    found = await email_log.detail(runtime(), principal(), email_id)
    return [EventOut.model_validate(e).model_dump(mode="json") for e in found.events]


@blueprint.post("/<id:email_id>/retry")
@document_response(SendResponse, 202)
async def retry(email_id: str) -> tuple[dict[str, Any], int]:
    return _send_response(await email_log.retry(runtime(), principal(), email_id)), 202
