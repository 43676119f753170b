"""Reading the email log: lists, one email with its recipients and events, and retries."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.platform.errors import Conflict, NotFound, Unprocessable, unknown_name
from engine.platform.runtime import Principal, Runtime
from engine.sending import statuses
from engine.sending.intake import AttachmentIn, Mailbox, SendRequest, SendResult, send
from storage import emails, suppressions
from storage import saved_searches as storage_saved
from storage.emails import Email, Event, Recipient, Search
from storage.engines import in_one_snapshot
from storage.tx import Tx

UPDATES_LIMIT = 50
# How old a change must be before the updates feed shows it. A change is stamped with its
# time before it commits (in its caller, then through group commit; on PostgreSQL beside
# other nodes' transactions), so one stamped earlier can still commit after a later one a
# reader has seen: a client going on from the later one's time would never see it. The
# feed waits out the time a unit of work takes from its stamp to its commit.
UPDATES_SETTLE = timedelta(seconds=5)
# Where an email came from, as stored in `emails.source`: the API one by one, the API's
# batch, the SMTP relay, a broadcast (bulk send to a contact list), an agent over MCP, a
# forwarding rule, the service itself (reports, notices).
SOURCES = ("api", "batch", "smtp", "broadcast", "mcp", "forward", "system")
EXPORT_LIMIT = 50_000  # rows of one CSV export; narrow the search for more
_EXPORT_PAGE = 500
_TOKENS = {
    "to": "to",
    "from": "sender",
    "status": "status",
    "domain": "domain",
    "tag": "tags",
    "destination": "destinations",
}
# A word `name:value` whose name is a word of letters is a token; any other word (one in
# double quotes, a URL, `12:30`, `Re:`) is free text.
_TOKEN = re.compile(r"(?P<name>[A-Za-z_]+):(?P<value>.*)", re.S)


def _refused(where: str, field: str, message: str) -> Unprocessable:
    return Unprocessable(
        f"{where}.{field}: {message}", errors=[{"loc": [where, field], "msg": message}]
    )


def _status(value: str, where: str, field: str) -> str:
    if value not in statuses.EMAIL_STATUSES:
        raise _refused(where, field, unknown_name("status", value, statuses.EMAIL_STATUSES))
    return value


def parse_query(
    q: str,
    status: str | None = None,
    tag: str | None = None,
    *,
    where: str = "query",
    source: str | None = None,
    created_from: datetime | None = None,
    created_before: datetime | None = None,
) -> Search:
    """The search a `q` string asks for: `to:`, `from:`, `status:`, `domain:` (the sending
    domain), `tag:`, `destination:` (a recipient domain, exactly) tokens, every other word
    free text across sender, subject and recipients; a word in double quotes is free text
    even with a colon in it.

    Unprocessable, naming the word, for a token nobody knows (`source:mcp`), a token with no
    value, and a status no email can have (in `q` or in `status`): each would otherwise
    match nothing and read as "no email matches". `where` is what the caller's door calls
    the search's parameters (`query`, `arguments`), for the error's loc. `source` (one of
    SOURCES) and the range `created_from` (inclusive) to `created_before` (exclusive) narrow
    it further (a time without a zone is UTC); a range that ends before it starts is
    refused."""
    parts: dict[str, list[str]] = {name: [] for name in (*_TOKENS.values(), "words")}
    for word in q.split():
        if len(word) > 1 and word.startswith('"') and word.endswith('"'):
            parts["words"].append(word[1:-1])
            continue
        token = _TOKEN.fullmatch(word)
        if token is None or token["value"].startswith("//"):
            parts["words"].append(word)
            continue
        name, value = token["name"].lower(), token["value"]
        if name not in _TOKENS and not value:  # `Re:`, `Fwd:`: words of a subject
            parts["words"].append(word)
            continue
        if name not in _TOKENS:
            message = unknown_name("search token", f"{name}:", [f"{t}:" for t in _TOKENS])
            raise _refused(
                where, "q", f"{message} (put a word in double quotes to search for it as text)"
            )
        if not value:
            raise _refused(
                where, "q", f"search token {name}: needs a value, as in {name}:something"
            )
        if name == "status":
            value = _status(value.lower(), where, "q")
        parts[_TOKENS[name]].append(value)
    if status:
        parts["status"].append(_status(status, where, "status"))
    if tag:
        parts["tags"].append(tag)
    if source and source not in SOURCES:
        raise _refused(where, "source", unknown_name("source", source, SOURCES))
    created_from, created_before = _utc(created_from), _utc(created_before)
    if created_from and created_before and created_before <= created_from:
        raise _refused(where, "created_before", "must be later than created_from")
    return Search(
        **parts,
        sources=[source] if source else [],
        created_from=created_from,
        created_before=created_before,
    )


def _utc(value: datetime | None) -> datetime | None:
    return value if value is None or value.tzinfo else value.replace(tzinfo=UTC)


async def search(
    rt: Runtime, who: Principal, query: Search, page_number: int, limit: int
) -> list[Email]:
    return await rt.db.read(emails.search, who.workspace_id, query, page_number * limit, limit)


async def count(rt: Runtime, who: Principal, query: Search) -> int:
    return await rt.db.read(emails.count, who.workspace_id, query)


async def export(rt: Runtime, who: Principal, query: Search) -> AsyncIterator[Email]:
    """The emails matching the search, newest first, at most EXPORT_LIMIT, read a page at a
    time so an export never holds the log in memory."""
    after: tuple[datetime, str] | None = None
    left = EXPORT_LIMIT
    while left > 0:
        found = await rt.db.read(
            emails.search_after, who.workspace_id, query, after, min(left, _EXPORT_PAGE)
        )
        for email in found:
            yield email
        if len(found) < min(left, _EXPORT_PAGE):
            return
        left -= len(found)
        after = (found[-1].created_at, found[-1].id)


async def updates(rt: Runtime, who: Principal, since: datetime) -> list[Email]:
    """Up to 50 emails created or updated after `since` and at least UPDATES_SETTLE ago,
    oldest change first."""
    until = rt.clock.now() - UPDATES_SETTLE
    return await rt.db.read(emails.updated_since, who.workspace_id, since, until, UPDATES_LIMIT)


@dataclass(frozen=True, slots=True)
class EmailDetail:
    email: Email
    recipients: list[Recipient]
    events: list[Event]
    # Its recipients now on the suppression list, with the reason: a retry is refused for them.
    suppressed: dict[str, str]


@in_one_snapshot
def _detail(tx: Tx, workspace_id: str, email_id: str) -> EmailDetail | None:
    email = emails.get(tx, workspace_id, email_id)
    if email is None:
        return None
    recipients = emails.recipients_of(tx, email_id)
    suppressed = suppressions.suppressed_among(tx, workspace_id, [r.address for r in recipients])
    return EmailDetail(email, recipients, emails.events_of(tx, email_id), suppressed)


async def detail(rt: Runtime, who: Principal, email_id: str) -> EmailDetail:
    found = await rt.db.read(_detail, who.workspace_id, email_id)
    if found is None:
        raise NotFound("email not found")
    return found


def _mailboxes(entries: list[dict[str, str | None]]) -> tuple[Mailbox, ...]:
    return tuple(Mailbox(str(e["email"]), e.get("name")) for e in entries)


async def retry(rt: Runtime, who: Principal, email_id: str, *, logged: bool = False) -> SendResult:
    """Send a bounced, rejected or failed email again as a new email linked to it (`logged`:
    with its activity entry, as intake.send)."""
    original = (await detail(rt, who, email_id)).email
    if original.status not in statuses.RETRYABLE:
        raise Conflict(
            f"only bounced, rejected or failed emails can be retried; this one is {original.status}",
            code="not_retryable",
        )
    request = SendRequest(
        from_=Mailbox(original.from_address, original.from_name),
        to=_mailboxes(original.to),
        cc=_mailboxes(original.cc),
        bcc=_mailboxes(original.bcc),
        reply_to=None if original.reply_to is None else _mailboxes([original.reply_to])[0],
        subject=original.subject,
        html=original.html,
        text=original.text,
        headers=dict(original.headers),
        tags=tuple(original.tags),
        attachments=tuple(
            AttachmentIn(a["filename"], a["content_base64"], a["content_type"])
            for a in original.attachments
        ),
        unsubscribe=original.unsubscribe,
    )
    return await send(
        rt, who, request, source=original.source, retry_of_id=original.id, logged=logged
    )


async def saved_searches(rt: Runtime, who: Principal) -> list[dict[str, Any]]:
    """The caller's saved searches in this workspace."""
    return await rt.db.read(storage_saved.get, who.workspace_id, who.user_id)


async def replace_saved_searches(
    rt: Runtime, who: Principal, searches: list[dict[str, Any]]
) -> None:
    """Replace the caller's whole list (at most 50, checked at the edge)."""
    await rt.db.write(
        storage_saved.replace, who.workspace_id, who.user_id, searches, rt.clock.now()
    )
