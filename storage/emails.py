"""Emails, their per-recipient delivery state, and their events.

Delivery is tracked per recipient; an email's `status` summarises its recipients and is
recomputed in the same unit of work that changes them. Recipients are claimed for delivery
with a lease (`lease_until`, `leased_by`), renewed by the holder's heartbeat and freed when
it dies (storage/nodes.py), so a crashed node's work is taken over in seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

from storage import incidents
from storage.codec import (
    contains,
    from_json,
    in_list,
    new_id,
    parse_optional_timestamp,
    parse_timestamp,
    timestamp,
    to_json,
)
from storage.engines import in_one_snapshot
from storage.leases import FaultPolicy
from storage.tx import Row, Tx

ACTIVE = ("queued", "deferred")  # recipients still to be tried


@dataclass(frozen=True, slots=True)
class Email:
    id: str
    workspace_id: str
    domain_id: str
    from_address: str
    from_name: str | None
    to: list[dict[str, Any]]
    cc: list[dict[str, Any]]
    bcc: list[dict[str, Any]]
    reply_to: dict[str, Any] | None
    subject: str
    html: str | None
    text: str | None
    headers: dict[str, str]
    tags: list[str]
    attachments: list[dict[str, str]]
    status: str
    source: str
    message_id: str
    rejection_reason: str | None
    retry_of_id: str | None
    send_at: datetime | None
    created_at: datetime
    updated_at: datetime
    delivered_at: datetime | None
    # The message as submitted (SMTP relay, forwards), sent as given; None for API emails.
    # Loaded only for delivery (`with_raw`), never by lists.
    raw: bytes | None = None
    # Carries List-Unsubscribe and `{{unsubscribe_url}}`: broadcasts, and emails whose sender
    # asked; only such mail is blocked by an unsubscribe (engine/suppressions/scopes.py).
    unsubscribe: bool = False
    # The broadcast the email is one of (the complaint-rate guard pauses it as a whole).
    broadcast_id: str | None = None
    # Submitted with REQUIRETLS (RFC 8689): delivered only over TLS verified by DANE or
    # MTA-STS to a server offering REQUIRETLS, else it fails with 5.7.30.
    requiretls: bool = False


@dataclass(frozen=True, slots=True)
class Recipient:
    email_id: str
    address: str
    kind: str  # to, cc or bcc
    domain: str
    status: str
    attempts: int
    next_attempt_at: datetime | None
    last_response: str | None
    queued_at: datetime
    # When its 72-hour retry window starts if not at queued_at: when a budget let it go.
    expiry_from: datetime | None = None


@dataclass(frozen=True, slots=True)
class Event:
    id: str
    email_id: str
    workspace_id: str
    event_type: str  # queued, sent, delivered, ...; webhooks call it email.delivered etc.
    recipient: str | None
    metadata: dict[str, Any]
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Move:
    """A status change the engine's transition table allows (engine/sending/statuses.py):
    rows in one of `from_` go to `to`. Storage carries moves out; it never picks statuses."""

    from_: tuple[str, ...]
    to: str


def _among(statuses: Sequence[str]) -> tuple[str, dict[str, str]]:
    """`status IN (...)` for `statuses`, and its parameters."""
    names, params = in_list("status", statuses)
    return f"status IN ({names})", params


@dataclass(frozen=True, slots=True)
class RecipientUpdate:
    """The outcome of one delivery attempt for one recipient."""

    email_id: str
    address: str
    status: str
    next_attempt_at: datetime | None
    last_response: str | None


def _email(row: Row) -> Email:
    return Email(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        from_address=row["from_address"],
        from_name=row["from_name"],
        to=from_json(row["to_addresses"]),
        cc=from_json(row["cc_addresses"]),
        bcc=from_json(row["bcc_addresses"]),
        reply_to=from_json(row["reply_to"]),
        subject=row["subject"],
        html=row["html"],
        text=row["text_body"],
        headers=from_json(row["headers"]),
        tags=from_json(row["tags"]),
        # Only the detail and delivery read them (joined from email_attachments).
        attachments=from_json(row.get("attachments")) or [],
        status=row["status"],
        source=row["source"],
        message_id=row["message_id"],
        rejection_reason=row["rejection_reason"],
        retry_of_id=row["retry_of_id"],
        send_at=parse_optional_timestamp(row["send_at"]),
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
        delivered_at=parse_optional_timestamp(row["delivered_at"]),
        unsubscribe=bool(row.get("unsubscribe")),
        broadcast_id=row.get("broadcast_id"),
        requiretls=bool(row.get("requiretls")),
    )


def _recipient(row: Row) -> Recipient:
    return Recipient(
        email_id=row["email_id"],
        address=row["address"],
        kind=row["kind"],
        domain=row["domain"],
        status=row["status"],
        attempts=int(row["attempts"]),
        next_attempt_at=parse_optional_timestamp(row["next_attempt_at"]),
        last_response=row["last_response"],
        queued_at=parse_timestamp(row["queued_at"]),
        expiry_from=parse_optional_timestamp(row.get("expiry_from")),
    )


def _event(row: Row) -> Event:
    return Event(
        id=row["id"],
        email_id=row["email_id"],
        workspace_id=row["workspace_id"],
        event_type=row["event_type"],
        recipient=row["recipient"],
        metadata=from_json(row["metadata"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(
    tx: Tx,
    emails: Sequence[Email],
    recipients: Sequence[Recipient],
    events: Sequence[Event],
    *,
    announce: bool = True,
) -> None:
    """Store accepted emails with their recipients and first events (the engine queues their
    webhook deliveries in the same unit of work), in multi-row statements; once committed,
    delivery on every node hears of the recipient domains unless `announce` is off (a bulk
    send announces once, after its last chunk). Run in the caller's `Tx.pipeline`, the rows
    of every table (and the outbox's) go to PostgreSQL in one round trip."""
    if announce:
        for domain in {r.domain for r in recipients}:
            tx.notify(f"mail:{domain}")
    tx.execute_many(
        "INSERT INTO emails (id, workspace_id, domain_id, from_address, from_name, to_addresses,"
        " cc_addresses, bcc_addresses, reply_to, subject, html, text_body, headers, tags,"
        " status, source, message_id, rejection_reason, retry_of_id, send_at,"
        " created_at, updated_at, unsubscribe, broadcast_id, requiretls) VALUES (:id, :ws,"
        " :domain_id,"
        " :from_address,"
        " :from_name, :to, :cc, :bcc, :reply_to, :subject, :html, :text, :headers, :tags,"
        " :status, :source, :message_id, :rejection_reason, :retry_of_id, :send_at,"
        " :created_at, :created_at, :unsubscribe, :broadcast_id, :requiretls)",
        (
            {
                "id": e.id,
                "ws": e.workspace_id,
                "domain_id": e.domain_id,
                "from_address": e.from_address,
                "from_name": e.from_name,
                "to": to_json(e.to),
                "cc": to_json(e.cc),
                "bcc": to_json(e.bcc),
                "reply_to": None if e.reply_to is None else to_json(e.reply_to),
                "subject": e.subject,
                "html": e.html,
                "text": e.text,
                "headers": to_json(e.headers),
                "tags": to_json(e.tags),
                "status": e.status,
                "source": e.source,
                "message_id": e.message_id,
                "rejection_reason": e.rejection_reason,
                "retry_of_id": e.retry_of_id,
                "send_at": None if e.send_at is None else timestamp(e.send_at),
                "created_at": timestamp(e.created_at),
                "unsubscribe": e.unsubscribe,
                "broadcast_id": e.broadcast_id,
                "requiretls": e.requiretls,
            }
            for e in emails
        ),
    )
    tx.execute_many(
        "INSERT INTO email_attachments (email_id, attachments) VALUES (:id, :attachments)",
        ({"id": e.id, "attachments": to_json(e.attachments)} for e in emails if e.attachments),
    )
    tx.execute_many(
        "INSERT INTO email_recipients (email_id, address, kind, domain, status, attempts,"
        " next_attempt_at, queued_at, updated_at) VALUES (:email_id, :address, :kind, :domain,"
        " :status, 0, :next_attempt_at, :queued_at, :queued_at)",
        (
            {
                "email_id": r.email_id,
                "address": r.address,
                "kind": r.kind,
                "domain": r.domain,
                "status": r.status,
                "next_attempt_at": None
                if r.next_attempt_at is None
                else timestamp(r.next_attempt_at),
                "queued_at": timestamp(r.queued_at),
            }
            for r in recipients
        ),
    )
    insert_events(tx, events)


def insert_events(tx: Tx, events: Iterable[Event]) -> list[Event]:
    """Record events; those recorded, for the engine to queue their webhook deliveries in the
    same transaction (engine/webhooks/outbox.py)."""
    events = list(events)
    tx.execute_many(
        "INSERT INTO email_events (id, email_id, workspace_id, event_type, recipient, metadata,"
        " created_at) VALUES (:id, :email_id, :ws, :type, :recipient, :metadata, :created_at)",
        (
            {
                "id": e.id,
                "email_id": e.email_id,
                "ws": e.workspace_id,
                "type": e.event_type,
                "recipient": e.recipient,
                "metadata": to_json(e.metadata),
                "created_at": timestamp(e.created_at),
            }
            for e in events
        ),
    )
    return events


_WITH_ATTACHMENTS = (
    "SELECT e.*, a.attachments FROM emails e LEFT JOIN email_attachments a ON a.email_id = e.id"
)


def get(tx: Tx, workspace_id: str, email_id: str) -> Email | None:
    """One email of the workspace, attachments included."""
    row = tx.one(
        f"{_WITH_ATTACHMENTS} WHERE e.workspace_id = :ws AND e.id = :id",
        {"ws": workspace_id, "id": email_id},
    )
    return None if row is None else _email(row)


USAGE_SHARDS = 16


def sent_in_month(tx: Tx, workspace_id: str, month: str, counting_in: int | None = None) -> int:
    """Emails the workspace sent (not rejected) in a calendar month ('YYYY-MM').

    A write about to add to the volume in shard `counting_in` (`count_sent`) locks that
    shard's row first on PostgreSQL, so the node's transactions that check and then count
    (its two writers) take turns, each seeing the others' counts: no overshoot of the plan's
    volume within a node. Nodes count in their own shards and never wait on each other; near
    the plan's limit a write takes the workspace's lock too (`hold_volume`, engine/sending/
    intake.py `counted_volume`). SQLite has one writer per file."""
    if counting_in is not None and tx.dialect == "postgresql":
        tx.execute(
            "INSERT INTO usage_shards (workspace_id, month, shard, emails)"
            " VALUES (:ws, :month, :shard, 0) ON CONFLICT (workspace_id, month, shard)"
            " DO UPDATE SET emails = usage_shards.emails",
            {"ws": workspace_id, "month": month, "shard": counting_in % USAGE_SHARDS},
        )
    value = tx.value(
        "SELECT SUM(emails) FROM usage_shards WHERE workspace_id = :ws AND month = :month",
        {"ws": workspace_id, "month": month},
    )
    return 0 if value is None else int(value)


def hold_volume(tx: Tx, workspace_id: str) -> None:
    """Hold the workspace's volume lock until commit (PostgreSQL: its row, FOR NO KEY UPDATE,
    which the foreign-key checks of its rows' inserts do not wait on); writes that hold it
    take turns across nodes. SQLite has one writer per file."""
    if tx.dialect == "postgresql":
        tx.execute(
            "SELECT 1 FROM workspaces WHERE id = :ws FOR NO KEY UPDATE", {"ws": workspace_id}
        )


def count_sent(tx: Tx, workspace_id: str, month: str, emails: int, shard: int) -> None:
    """Add to the workspace's monthly volume, in the caller's shard (one per node: nodes never
    wait on each other's row)."""
    tx.execute(
        "INSERT INTO usage_shards (workspace_id, month, shard, emails)"
        " VALUES (:ws, :month, :shard, :n) ON CONFLICT (workspace_id, month, shard)"
        " DO UPDATE SET emails = usage_shards.emails + :n",
        {"ws": workspace_id, "month": month, "shard": shard % USAGE_SHARDS, "n": emails},
    )


def _rows_by_ids(tx: Tx, email_ids: Sequence[str]) -> list[Row]:
    if not email_ids:
        return []
    names = {f"id{i}": email_id for i, email_id in enumerate(email_ids)}
    placeholders = ", ".join(f":{name}" for name in names)
    return tx.all(f"{_WITH_ATTACHMENTS} WHERE e.id IN ({placeholders})", names)


def by_ids(tx: Tx, email_ids: Sequence[str]) -> dict[str, Email]:
    """The emails with these ids (any workspace), in one query."""
    return {row["id"]: _email(row) for row in _rows_by_ids(tx, email_ids)}


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A stored email row no code can read, and why (it is failed, never retried)."""

    workspace_id: str
    error: str


def readable_by_ids(
    tx: Tx, email_ids: Sequence[str]
) -> tuple[dict[str, Email], dict[str, Unreadable]]:
    """The emails with these ids, in one query; apart, those whose row cannot be read."""
    found: dict[str, Email] = {}
    unreadable: dict[str, Unreadable] = {}
    for row in _rows_by_ids(tx, email_ids):
        try:
            found[row["id"]] = _email(row)
        except Exception as exc:  # one bad row must not stop the others' delivery
            error = f"the stored email cannot be read: {exc!r}"
            unreadable[row["id"]] = Unreadable(str(row["workspace_id"]), error)
    return found, unreadable


def insert_raw(tx: Tx, email_id: str, data: bytes) -> None:
    """Keep the message of an email that is sent as given (inserted with the email)."""
    inline = tx.inline_octets(data)
    tx.execute(
        "INSERT INTO raw_messages (email_id, data) VALUES (:id, :data)",
        {"id": email_id, "data": data if inline else b""},
    )
    if not inline:
        tx.write_octets("raw_messages", "data", "email_id", email_id, data)


def with_raw(
    tx: Tx, found: dict[str, Email], larger_than: int | None = None
) -> tuple[dict[str, Email], dict[str, int]]:
    """The same emails, those sent as given carrying their message (`Email.raw`); with
    `larger_than`, messages of more octets are left out and their sizes returned instead
    (by email id), to be read one at a time (`raw_of`)."""
    if not found:
        return found, {}
    placeholders, names = in_list("id", list(found))
    large: dict[str, int] = {}
    if larger_than is not None:
        rows = tx.all(
            "SELECT email_id, LENGTH(data) AS size FROM raw_messages"
            f" WHERE email_id IN ({placeholders})",
            names,
        )
        large = {r["email_id"]: int(r["size"]) for r in rows if int(r["size"]) > larger_than}
        small = [email_id for email_id in found if email_id not in large]
        if not small:
            return found, large
        placeholders, names = in_list("id", small)
    rows = tx.all(
        f"SELECT email_id, data FROM raw_messages WHERE email_id IN ({placeholders})", names
    )
    raw = {row["email_id"]: bytes(row["data"]) for row in rows}
    return {i: replace(e, raw=raw[i]) if i in raw else e for i, e in found.items()}, large


def raw_of(tx: Tx, email_id: str) -> bytes | None:
    """The submitted message of one email sent as given (None if it has none)."""
    row = tx.octets("SELECT data FROM raw_messages WHERE email_id = :id", {"id": email_id})
    return None if row is None else bytes(row["data"])


def give_back(tx: Tx, recipients: Sequence[Recipient], node: str) -> None:
    """Release the leases of claimed recipients left untried (due again at once)."""
    tx.execute_many(
        "UPDATE email_recipients SET lease_until = NULL, leased_by = NULL"
        " WHERE email_id = :email_id AND address = :address AND leased_by = :node",
        ({"email_id": r.email_id, "address": r.address, "node": node} for r in recipients),
    )


def recipients_of(tx: Tx, email_id: str) -> list[Recipient]:
    rows = tx.all(
        "SELECT * FROM email_recipients WHERE email_id = :id ORDER BY kind DESC, address",
        {"id": email_id},
    )
    return [_recipient(row) for row in rows]


def events_of(tx: Tx, email_id: str) -> list[Event]:
    rows = tx.all(
        "SELECT * FROM email_events WHERE email_id = :id ORDER BY created_at, id", {"id": email_id}
    )
    return [_event(row) for row in rows]


def scheduled(tx: Tx, workspace_id: str) -> list[Email]:
    """The workspace's emails still waiting for their send_at, soonest first."""
    rows = tx.all(
        "SELECT * FROM emails WHERE workspace_id = :ws AND status = 'scheduled'"
        " ORDER BY send_at, id",
        {"ws": workspace_id},
    )
    return [_email(row) for row in rows]


def cancel_scheduled(
    tx: Tx, workspace_id: str, email_id: str, now: datetime, email: Move, recipients: Move
) -> bool:
    """Cancel an email still waiting for its send_at (`email`, and its waiting `recipients`);
    False if it is not scheduled."""
    among, params = _among(email.from_)
    changed = tx.execute(
        f"UPDATE emails SET status = :to, updated_at = :now"
        f" WHERE workspace_id = :ws AND id = :id AND {among}",
        {"to": email.to, "now": timestamp(now), "ws": workspace_id, "id": email_id, **params},
    )
    if changed:
        _move_recipients(tx, email_id, recipients, now)
    return changed == 1


def _move_recipients(tx: Tx, email_id: str, move: Move, now: datetime) -> None:
    among, params = _among(move.from_)
    tx.execute(
        f"UPDATE email_recipients SET status = :to, updated_at = :now"
        f" WHERE email_id = :id AND {among}",
        {"to": move.to, "now": timestamp(now), "id": email_id, **params},
    )


def make_due(tx: Tx, email_id: str, now: datetime, email: Move, waiting: Sequence[str]) -> None:
    """Send a scheduled email now (`email`): its `waiting` recipients are due now, and
    delivery hears of their domains."""
    among, params = _among(waiting)
    tx.execute(
        f"UPDATE email_recipients SET next_attempt_at = :now, updated_at = :now"
        f" WHERE email_id = :id AND {among}",
        {"now": timestamp(now), "id": email_id, **params},
    )
    among, params = _among(email.from_)
    tx.execute(
        f"UPDATE emails SET status = :to, updated_at = :now WHERE id = :id AND {among}",
        {"to": email.to, "now": timestamp(now), "id": email_id, **params},
    )
    rows = tx.all(
        "SELECT DISTINCT domain FROM email_recipients WHERE email_id = :id", {"id": email_id}
    )
    for row in rows:
        tx.notify(f"mail:{row['domain']}")


def reject(
    tx: Tx, email_id: str, reason: str, now: datetime, email: Move, recipients: Move
) -> None:
    """Reject an email (`email`; nothing of it will be sent: its waiting `recipients` move)."""
    among, params = _among(email.from_)
    tx.execute(
        f"UPDATE emails SET status = :to, rejection_reason = :reason, updated_at = :now"
        f" WHERE id = :id AND {among}",
        {"to": email.to, "reason": reason, "now": timestamp(now), "id": email_id, **params},
    )
    _move_recipients(tx, email_id, recipients, now)


@dataclass(frozen=True, slots=True)
class Search:
    """What the email log is filtered by; every part is optional and they all apply."""

    to: list[str]
    sender: list[str]
    status: list[str]
    domain: list[str]
    tags: list[str]
    words: list[str]
    destinations: list[str]  # recipient domains, exactly: an email with a recipient there
    broadcasts: list[str] = field(default_factory=list)  # ids: the emails of these broadcasts
    # Domain ids: their emails that offer unsubscribe and are no broadcast's.
    marketing_of: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)  # where the email came from: any of these
    created_from: datetime | None = None  # created at or after
    created_before: datetime | None = None  # created strictly before


def search_clauses(workspace_id: str, query: Search, params: dict[str, Any]) -> str:
    """The WHERE condition (over `emails`) matching every part of the search in the
    workspace, its values added to `params`: the one rule the email log and queue actions
    share."""
    clauses = ["workspace_id = :ws"]
    params["ws"] = workspace_id

    def add(sql: str, value: str) -> None:
        name = f"p{len(params)}"
        clauses.append(sql.replace(":p", f":{name}"))
        params[name] = value

    for text in query.to:
        add("LOWER(to_addresses || cc_addresses) LIKE :p ESCAPE '!'", contains(text.lower()))
    for text in query.sender:
        add("LOWER(from_address) LIKE :p ESCAPE '!'", contains(text.lower()))
    for status in query.status:
        add("status = :p", status)
    for text in query.domain:
        add("LOWER(from_address) LIKE :p ESCAPE '!'", "%@" + contains(text.lower()))
    for tag in query.tags:
        add("tags LIKE :p ESCAPE '!'", contains(to_json(tag)))  # the tag as a whole JSON string
    for destination in query.destinations:
        add(
            "EXISTS (SELECT 1 FROM email_recipients sr WHERE sr.email_id = emails.id"
            " AND sr.domain = :p)",
            destination.lower(),
        )
    if query.broadcasts:
        names = {f"b{len(params) + i}": b for i, b in enumerate(query.broadcasts)}
        clauses.append(f"broadcast_id IN ({', '.join(f':{name}' for name in names)})")
        params.update(names)
    for domain_id in query.marketing_of:
        add("domain_id = :p AND unsubscribe = TRUE AND broadcast_id IS NULL", domain_id)
    for word in query.words:
        add(
            "LOWER(from_address || ' ' || subject || ' ' || to_addresses || cc_addresses)"
            " LIKE :p ESCAPE '!'",
            contains(word.lower()),
        )
    if query.sources:
        listed, values = in_list(f"s{len(params)}_", query.sources)
        clauses.append(f"source IN ({listed})")
        params.update(values)
    if query.created_from is not None:
        add("created_at >= :p", timestamp(query.created_from))
    if query.created_before is not None:
        add("created_at < :p", timestamp(query.created_before))
    return " AND ".join(clauses)


def search(tx: Tx, workspace_id: str, query: Search, offset: int, limit: int) -> list[Email]:
    """Emails matching every part of the search, newest first."""
    params: dict[str, Any] = {"limit": limit, "offset": offset}
    where = search_clauses(workspace_id, query, params)
    rows = tx.all(
        f"SELECT * FROM emails WHERE {where}"
        " ORDER BY created_at DESC, id DESC LIMIT :limit OFFSET :offset",
        params,
    )
    return [_email(row) for row in rows]


def count(tx: Tx, workspace_id: str, query: Search) -> int:
    """How many emails match every part of the search."""
    params: dict[str, Any] = {}
    where = search_clauses(workspace_id, query, params)
    row = tx.one(f"SELECT COUNT(*) AS n FROM emails WHERE {where}", params)
    return int(row["n"]) if row else 0


def search_after(
    tx: Tx, workspace_id: str, query: Search, after: tuple[datetime, str] | None, limit: int
) -> list[Email]:
    """Emails matching the search, newest first, starting past `after` (the created_at and
    id of the last one already read): the pages of an export, which offsets would shift
    under emails arriving while it runs."""
    params: dict[str, Any] = {"limit": limit}
    where = search_clauses(workspace_id, query, params)
    if after is not None:
        where += " AND (created_at < :after_at OR (created_at = :after_at AND id < :after_id))"
        params["after_at"], params["after_id"] = timestamp(after[0]), after[1]
    rows = tx.all(
        f"SELECT * FROM emails WHERE {where} ORDER BY created_at DESC, id DESC LIMIT :limit",
        params,
    )
    return [_email(row) for row in rows]


@in_one_snapshot
def updated_since(
    tx: Tx, workspace_id: str, since: datetime, until: datetime, limit: int
) -> list[Email]:
    """Emails created or changed after `since` and at or before `until`, oldest change
    first: `limit` of them, and those changed at the same time as the last (the rows of one
    commit share its time, and a reader goes on from the last one's time)."""
    rows = tx.all(
        "SELECT * FROM emails WHERE workspace_id = :ws AND updated_at > :since"
        " AND updated_at <= :until ORDER BY updated_at, id LIMIT :limit",
        {
            "ws": workspace_id,
            "since": timestamp(since),
            "until": timestamp(until),
            "limit": limit,
        },
    )
    if len(rows) == limit:
        last = rows[-1]
        rows += tx.all(
            "SELECT * FROM emails WHERE workspace_id = :ws AND updated_at = :at AND id > :id"
            " ORDER BY id",
            {"ws": workspace_id, "at": last["updated_at"], "id": last["id"]},
        )
    return [_email(row) for row in rows]


# Every domain with recipients in a waiting status, found by skipping from one domain to the
# next along the (status, domain, …) index: one index probe per domain, where DISTINCT reads
# every waiting recipient (a million queued: 200 ms against 7 ms on PostgreSQL).
_DOMAINS_WITH_WORK = """
WITH RECURSIVE waiting (status) AS (VALUES ('queued'), ('deferred')),
found (status, domain) AS (
    SELECT status, (SELECT min(domain) FROM email_recipients r WHERE r.status = w.status)
    FROM waiting w
    UNION ALL
    SELECT f.status, (
        SELECT min(domain) FROM email_recipients r WHERE r.status = f.status AND r.domain > f.domain
    )
    FROM found f WHERE f.domain IS NOT NULL
)
SELECT DISTINCT domain FROM found WHERE domain IS NOT NULL
"""


def domains_with_work(tx: Tx) -> list[str]:
    """Every recipient domain that has recipients still to try."""
    return [row["domain"] for row in tx.all(_DOMAINS_WITH_WORK)]


# A domain's recipients due now, unleased and not paused, in the order they are claimed.
_DUE = (
    "domain = :domain AND status IN ('queued', 'deferred') AND next_attempt_at <= :now"
    f" AND (lease_until IS NULL OR lease_until < :now) AND NOT {incidents.PAUSED}"
    " ORDER BY next_attempt_at, email_id LIMIT :limit"
)


def due_email_ids(tx: Tx, domain: str, now: datetime, limit: int) -> set[str]:
    """The emails of the next `limit` recipients a claim of the domain would take now (one
    may then take others: they are not leased here)."""
    params: dict[str, Any] = {"domain": domain, "now": timestamp(now), "limit": limit}
    rows = tx.all(f"SELECT email_id FROM email_recipients WHERE {_DUE}", params)
    return {str(row["email_id"]) for row in rows}


def claim(
    tx: Tx, domain: str, now: datetime, lease_until: datetime, node: str, limit: int
) -> tuple[list[Recipient], datetime | None]:
    """Lease up to `limit` due recipients of a domain; and when the next one falls due.
    Recipients whose sending domain has a paused incident here wait for its end."""
    params: dict[str, Any] = {"domain": domain, "now": timestamp(now), "limit": limit}
    lock = tx.row_lock("FOR UPDATE SKIP LOCKED")
    rows = tx.all(f"SELECT * FROM email_recipients WHERE {_DUE}{lock}", params)
    claimed = [_recipient(row) for row in rows]
    tx.execute_many(
        "UPDATE email_recipients SET lease_until = :lease, leased_by = :node"
        " WHERE email_id = :email_id AND address = :address",
        (
            {
                "lease": timestamp(lease_until),
                "node": node,
                "email_id": r.email_id,
                "address": r.address,
            }
            for r in claimed
        ),
    )
    # The next due recipient, or the end of a pause holding some back, whichever is first:
    # per status, the first in the due index that is neither leased nor paused. (A MIN over
    # both statuses tested every waiting recipient for a pause: 9 ms a claim with 5,000
    # waiting on PostgreSQL, where this stops at the first one free, past those just leased.)
    first = [
        f"(SELECT next_attempt_at FROM email_recipients WHERE status = '{status}'"
        " AND domain = :domain AND next_attempt_at IS NOT NULL"
        f" AND (lease_until IS NULL OR lease_until < :now) AND NOT {incidents.PAUSED}"
        f" ORDER BY next_attempt_at LIMIT 1) AS {status}"
        for status in ("queued", "deferred")
    ]
    following = tx.one(
        f"SELECT {', '.join(first)}, ({incidents.PAUSE_ENDS}) AS pause_ends",
        {"domain": domain, "now": timestamp(now)},
    )
    assert following is not None
    due = [parse_timestamp(t) for t in following.values() if t]
    return claimed, min(due, default=None)


@dataclass(frozen=True, slots=True)
class Summary:
    """The engine's rule for an email's status once delivering (engine/sending/statuses.py)."""

    of: Callable[[Sequence[str]], str]  # the email's status, from its recipients'
    final: tuple[str, ...]  # emails in these keep theirs
    delivered: str  # an email summarised to this is stamped delivered_at


_TOUCHED = 500  # emails a statement of `touch` names, within both engines' parameter limits


def touch(tx: Tx, email_ids: Collection[str], now: datetime) -> None:
    """Count the emails as changed `now` (the updates feed shows them again from then)."""
    ordered = sorted(email_ids)
    for start in range(0, len(ordered), _TOUCHED):
        placeholders, names = in_list("id", ordered[start : start + _TOUCHED])
        tx.run(
            f"UPDATE emails SET updated_at = :now WHERE id IN ({placeholders})",
            {"now": timestamp(now), **names},
        )


def summarise(
    tx: Tx,
    email_ids: Sequence[str],
    now: datetime,
    summary: Summary,
    known: Mapping[str, Sequence[str]] | None = None,
) -> None:
    """Set each email's status from its recipients' by the engine's rule `summary` (after
    some of them changed): one read of their recipients and one UPDATE per resulting
    status; emails in a final status keep theirs. `known`: the statuses of every recipient
    of some of the emails, each row locked by this unit (it has just written them all), so
    no other unit can change one before this one ends: those emails need no read."""
    ids = list(dict.fromkeys(email_ids))
    if not ids:
        return
    known = known or {}
    statuses = {email_id: list(known[email_id]) for email_id in ids if email_id in known}
    unknown = [email_id for email_id in ids if email_id not in known]
    if unknown:
        placeholders, names = in_list("id", unknown)
        if tx.dialect == "postgresql":
            # Another node may be writing outcomes of other recipients of these emails: the
            # emails are locked first (in one order), so the node second to lock one reads its
            # recipients once the first has committed, and neither sums it up without the
            # other's outcomes.
            tx.run(
                f"SELECT id FROM emails WHERE id IN ({placeholders}) ORDER BY id FOR UPDATE",
                names,
            )
        statuses |= {email_id: [] for email_id in unknown}
        for row in tx.all(
            f"SELECT email_id, status FROM email_recipients WHERE email_id IN ({placeholders})",
            names,
        ):
            statuses[row["email_id"]].append(row["status"])
    by_status: dict[str, list[str]] = {}
    for email_id, found in statuses.items():
        by_status.setdefault(summary.of(found), []).append(email_id)
    final, final_params = _among(summary.final)
    for status, members in by_status.items():
        placeholders, names = in_list("id", members)
        tx.run(
            "UPDATE emails SET status = :status, updated_at = :now,"
            " delivered_at = CASE WHEN :status = :delivered THEN :now ELSE delivered_at END"
            f" WHERE id IN ({placeholders}) AND NOT {final}",
            {
                "status": status,
                "delivered": summary.delivered,
                "now": timestamp(now),
                **names,
                **final_params,
            },
        )


def record_faults(
    tx: Tx,
    recipients: Sequence[Recipient],
    error: str,
    now: datetime,
    policy: FaultPolicy,
    summary: Summary,
    quarantine: Move,
    holder: str,
) -> list[Event]:
    """Count a fault on each recipient `holder` still leases (its round made the delivery
    actor raise; one freed since is another node's) and try it again at `policy.retry_at`;
    those that reached `policy.quarantine_after` are quarantined (`quarantine`: `failed`)
    with the error, and an event of that name. The events of those quarantined, for the
    engine's outbox."""
    counting = {"error": error, "retry": timestamp(policy.retry_at), "now": timestamp(now)}
    keys = [
        key
        for key in ({"email_id": r.email_id, "address": r.address} for r in recipients)
        if tx.execute(
            "UPDATE email_recipients SET faults = faults + 1, last_fault = :error,"
            " lease_until = NULL, leased_by = NULL, next_attempt_at = :retry,"
            " updated_at = :now WHERE email_id = :email_id AND address = :address"
            " AND leased_by = :holder",
            counting | key | {"holder": holder},
        )
    ]
    note = f"quarantined after {policy.quarantine_after} faults: {error}"
    events: list[Event] = []
    among, params = _among(quarantine.from_)
    for key in keys:
        quarantined = tx.execute(
            "UPDATE email_recipients SET status = :to, next_attempt_at = NULL,"
            " last_response = :note WHERE email_id = :email_id AND address = :address"
            f" AND faults >= :limit AND {among}",
            {
                "to": quarantine.to,
                "note": note,
                "limit": policy.quarantine_after,
                **key,
                **params,
            },
        )
        if quarantined:
            workspace_id = tx.value("SELECT workspace_id FROM emails WHERE id = :email_id", key)
            at = now + timedelta(microseconds=len(events))
            event = Event(
                new_id(),
                key["email_id"],
                workspace_id,
                quarantine.to,
                key["address"],
                {"error": note},
                at,
            )
            events.append(event)
    insert_events(tx, events)
    summarise(tx, [e.email_id for e in events], now, summary)
    return events


def by_message_id(tx: Tx, workspace_id: str, message_id: str) -> list[Email]:
    """The workspace's emails with this Message-ID (one, unless a relay client reused one)."""
    rows = tx.all(
        f"{_WITH_ATTACHMENTS} WHERE e.workspace_id = :ws AND e.message_id = :message_id"
        " ORDER BY e.created_at, e.id",
        {"ws": workspace_id, "message_id": message_id},
    )
    return [_email(row) for row in rows]
