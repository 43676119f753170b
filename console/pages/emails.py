"""The email log: search with the API's tokens (`to:`, `from:`, `status:`, `domain:`,
`tag:`), source and date-range filters, the number matching, CSV export, saved searches,
paging; one email with its recipients (those suppressed since, linked), the event
timeline with the servers' replies, the sandbox outcomes it still has coming (with a
fast-forward), its header fields, its HTML in a sandboxed frame and its text; retry,
cancel and send now."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.emails import STATUSES, ExportQuery, SavedSearch, SearchQuery, export_csv
from console.web import form, framed_html, go, page, parse, problems_of, rt, who
from engine.platform.errors import EngineError, Unprocessable
from engine.sandbox import mailbox, outcomes
from engine.sending import email_log, scheduling

blueprint = Blueprint("emails", __name__)

PAGE_SIZE = 25
DONE = {
    "saved": "Search saved.",
    "unsaved": "Saved search removed.",
    "cancelled": "Scheduled email cancelled.",
    "sent_now": "Sending now.",
    "fast_forwarded": "The scripted outcomes are due now: they happen within 15 seconds.",
}


FILTERS = ("q", "status", "source", "created_from", "created_before")
MOMENTS = ("created_from", "created_before")


def _filters() -> dict[str, str]:
    """The log's filters as the page's query string gives them (empty ones left out)."""
    return {k: v for k, v in request.args.items() if k in FILTERS and v}


def _filters_of(search: dict[str, Any]) -> dict[str, str]:
    """The log's filters a saved search stands for (its words are `q`): its page's query."""
    named = {**search, "q": search.get("query")}
    return {k: str(named[k]) for k in FILTERS if named.get(k)}


def _moment_field(value: str | None) -> tuple[str, str]:
    """The input type and value a date filter is shown with: a date in a date input; a moment
    with a time of day (a saved search made through the API, a link) in a datetime-local
    input, in UTC, to the second, so that searching again keeps it where a date input would
    show it empty and drop it."""
    if not value or len(value) <= len("YYYY-MM-DD"):
        return "date", value or ""
    try:
        moment = datetime.fromisoformat(value)
        if moment.tzinfo is not None:
            moment = moment.astimezone(UTC).replace(tzinfo=None)
    except (ValueError, OverflowError):  # not a time, or none in UTC (9999-12-31T23:59-23:00)
        return "text", value  # shown as given, beside the problem that refused it
    return "datetime-local", moment.isoformat(timespec="seconds")


async def _index(status: int = 200, **extra: Any) -> Response:
    filters = _filters()
    args = dict(filters)
    if request.args.get("page"):
        args["page"] = request.args["page"]
    query, problems = parse(SearchQuery, {**args, "limit": PAGE_SIZE})
    query = query or SearchQuery.model_validate({"limit": PAGE_SIZE})
    runtime, principal = rt(), who()
    found, total = [], 0
    try:
        wanted = query.search()
    except Unprocessable as exc:  # an unknown token or status: said, not read as "no match"
        problems = {**problems_of(exc), **problems}
        status = max(status, 422)
    else:
        found = await email_log.search(runtime, principal, wanted, query.page, query.limit)
        total = await email_log.count(runtime, principal, wanted)
    saved = [(s, _filters_of(s)) for s in await email_log.saved_searches(runtime, principal)]
    extra.setdefault("problems", problems)
    return await page(
        "emails.html",
        status=status,
        title="Email log",
        query=query,
        emails=found,
        total=total,
        more=(query.page + 1) * query.limit < total,
        saved=saved,
        statuses=STATUSES,
        sources=email_log.SOURCES,
        filters=filters,
        moments={name: _moment_field(filters.get(name)) for name in MOMENTS},
        export_limit=email_log.EXPORT_LIMIT,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/emails")
async def index() -> Response:
    return await _index()


@blueprint.get("/emails/export")
async def export() -> Response:
    """The log as the page filters it, as CSV (api/routes/emails.py `export_csv`)."""
    query, problems = parse(ExportQuery, _filters())
    if query is None:
        return await _index(422, problems=problems)
    try:
        wanted = query.search()
    except Unprocessable as exc:
        return await _index(422, problems=problems_of(exc))
    return await export_csv(rt(), who(), wanted)


@blueprint.post("/emails/saved-searches")
async def save_search() -> Response:
    values = await form()
    entry, problems = parse(SavedSearch, values)
    if entry is None:
        return await _index(422, problems=problems)
    runtime, principal = rt(), who()
    current = await email_log.saved_searches(runtime, principal)
    searches = [*current, entry.stored()]
    if len(searches) > 50:
        return await _index(422, problems={"name": "at most 50 saved searches"})
    await email_log.replace_saved_searches(runtime, principal, searches)
    return go("console.emails.index", **_filters_of(entry.stored()), done="saved")


@blueprint.post("/emails/saved-searches/<search_id>/delete")
async def delete_search(search_id: str) -> Response:
    runtime, principal = rt(), who()
    current = await email_log.saved_searches(runtime, principal)
    kept = [s for s in current if s.get("id") != search_id]
    await email_log.replace_saved_searches(runtime, principal, kept)
    return go("console.emails.index", done="unsaved")


async def _detail(email_id: str, status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    found = await email_log.detail(runtime, principal, email_id)
    captured, _ = await mailbox.page(runtime, principal, email_id, 0, 20)
    pending = await outcomes.pending(runtime, principal, email_id)
    extra.setdefault("problems", {})
    return await page(
        "email.html",
        status=status,
        title=found.email.subject or "(no subject)",
        detail=found,
        captured=captured,
        pending=pending,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/emails/<id:email_id>")
async def detail(email_id: str) -> Response:
    return await _detail(email_id)


@blueprint.get("/emails/<id:email_id>/html")
async def html(email_id: str) -> Response:
    """The email's HTML as a document of its own, for the sandboxed frame of its page."""
    found = await email_log.detail(rt(), who(), email_id)
    return framed_html(found.email.html or "")


@blueprint.post("/emails/<id:email_id>/retry")
async def retry(email_id: str) -> Response:
    try:
        result = await email_log.retry(rt(), who(), email_id)
    except EngineError as exc:
        return await _detail(email_id, status_of(exc), problems=problems_of(exc))
    return go("console.emails.detail", email_id=result.id)


@blueprint.post("/emails/<id:email_id>/fast-forward")
async def fast_forward(email_id: str) -> Response:
    """The email's pending sandbox outcomes made due now (engine/sandbox/outcomes.py)."""
    await email_log.detail(rt(), who(), email_id)  # 404 for another workspace's email
    await outcomes.fast_forward(rt(), who(), email_id)
    return go("console.emails.detail", email_id=email_id, done="fast_forwarded")


@blueprint.post("/emails/<id:email_id>/cancel")
async def cancel(email_id: str) -> Response:
    try:
        await scheduling.cancel(rt(), who(), email_id)
    except EngineError as exc:
        return await _detail(email_id, status_of(exc), problems=problems_of(exc))
    return go("console.emails.detail", email_id=email_id, done="cancelled")


@blueprint.post("/emails/<id:email_id>/send-now")
async def send_now(email_id: str) -> Response:
    try:
        await scheduling.send_now(rt(), who(), email_id)
    except EngineError as exc:
        return await _detail(email_id, status_of(exc), problems=problems_of(exc))
    return go("console.emails.detail", email_id=email_id, done="sent_now")
