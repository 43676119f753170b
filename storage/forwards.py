"""Forwarding rules and the log of forwarded copies.

A source address has at most one rule across all workspaces (a unique index): the inbound
server must know which rule a message belongs to, and only one workspace can hold a domain
verified. Destination lists are JSON arrays. Every query but the inbound server's lookups
is scoped by workspace.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import from_json, parse_optional_timestamp, parse_timestamp, timestamp, to_json
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Forward:
    id: str
    workspace_id: str
    domain_id: str
    source_email: str
    destination_emails: list[str]
    destination_urls: list[str]
    is_active: bool
    delivery_count: int
    last_delivered_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class LogEntry:
    id: str
    forward_id: str
    from_address: str
    original_to: str
    forwarded_to: str
    subject: str
    message_id: str
    size_bytes: int
    created_at: datetime


def _forward(row: Row) -> Forward:
    return Forward(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        source_email=row["source_email"],
        destination_emails=from_json(row["destination_emails"]),
        destination_urls=from_json(row["destination_urls"]),
        is_active=bool(row["is_active"]),
        delivery_count=int(row["delivery_count"]),
        last_delivered_at=parse_optional_timestamp(row["last_delivered_at"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def _entry(row: Row) -> LogEntry:
    return LogEntry(
        id=row["id"],
        forward_id=row["forward_id"],
        from_address=row["from_address"],
        original_to=row["original_to"],
        forwarded_to=row["forwarded_to"],
        subject=row["subject"],
        message_id=row["message_id"],
        size_bytes=int(row["size_bytes"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(tx: Tx, forward: Forward) -> None:
    tx.execute(
        "INSERT INTO forwards (id, workspace_id, domain_id, source_email, destination_emails,"
        " destination_urls, is_active, delivery_count, last_delivered_at, created_at, updated_at)"
        " VALUES (:id, :ws, :domain, :source, :emails, :urls, :active, 0, NULL, :at, :at)",
        {
            "id": forward.id,
            "ws": forward.workspace_id,
            "domain": forward.domain_id,
            "source": forward.source_email,
            "emails": to_json(forward.destination_emails),
            "urls": to_json(forward.destination_urls),
            "active": forward.is_active,
            "at": timestamp(forward.created_at),
        },
    )


def count(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value("SELECT COUNT(*) FROM forwards WHERE workspace_id = :ws", {"ws": workspace_id})
    )


def get(tx: Tx, workspace_id: str, forward_id: str) -> Forward | None:
    row = tx.one(
        "SELECT * FROM forwards WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": forward_id},
    )
    return None if row is None else _forward(row)


def list_all(tx: Tx, workspace_id: str) -> list[Forward]:
    rows = tx.all(
        "SELECT * FROM forwards WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_forward(row) for row in rows]


def by_source(tx: Tx, source_email: str) -> Forward | None:
    """The rule for a source address, in any workspace (the inbound server's lookup)."""
    row = tx.one("SELECT * FROM forwards WHERE source_email = :source", {"source": source_email})
    return None if row is None else _forward(row)


def active_by_sources(tx: Tx, sources: Sequence[str]) -> list[Forward]:
    """The active rules for these source addresses whose domain the rule's workspace still
    has, in one query."""
    if not sources:
        return []
    names = {f"s{i}": source for i, source in enumerate(sources)}
    placeholders = ", ".join(f":{name}" for name in names)
    rows = tx.all(
        "SELECT f.* FROM forwards f JOIN domains d ON d.id = f.domain_id"
        f" AND d.workspace_id = f.workspace_id WHERE f.source_email IN ({placeholders})"
        " AND f.is_active = :on",
        {**names, "on": True},
    )
    return [_forward(row) for row in rows]


def update(tx: Tx, forward: Forward, now: datetime) -> None:
    tx.execute(
        "UPDATE forwards SET destination_emails = :emails, destination_urls = :urls,"
        " is_active = :active, updated_at = :at WHERE id = :id",
        {
            "emails": to_json(forward.destination_emails),
            "urls": to_json(forward.destination_urls),
            "active": forward.is_active,
            "at": timestamp(now),
            "id": forward.id,
        },
    )


def delete(tx: Tx, forward_id: str) -> None:
    tx.execute("DELETE FROM forwards WHERE id = :id", {"id": forward_id})


def move_domain(tx: Tx, domain_id: str, to_workspace_id: str) -> int:
    """Move every forward of a domain to another workspace (a domain transfer); how many."""
    return tx.execute(
        "UPDATE forwards SET workspace_id = :ws WHERE domain_id = :domain",
        {"ws": to_workspace_id, "domain": domain_id},
    )


def record_delivery(tx: Tx, entry: LogEntry, workspace_id: str) -> None:
    """Log one forwarded copy and count it on its rule."""
    tx.execute(
        "INSERT INTO forward_logs (id, forward_id, workspace_id, from_address, original_to,"
        " forwarded_to, subject, message_id, size_bytes, created_at) VALUES (:id, :fwd, :ws,"
        " :from_, :to, :dest, :subject, :msg, :size, :at)",
        {
            "id": entry.id,
            "fwd": entry.forward_id,
            "ws": workspace_id,
            "from_": entry.from_address,
            "to": entry.original_to,
            "dest": entry.forwarded_to,
            "subject": entry.subject,
            "msg": entry.message_id,
            "size": entry.size_bytes,
            "at": timestamp(entry.created_at),
        },
    )
    tx.execute(
        "UPDATE forwards SET delivery_count = delivery_count + 1, last_delivered_at = :at"
        " WHERE id = :id",
        {"at": timestamp(entry.created_at), "id": entry.forward_id},
    )


def logs_page(
    tx: Tx, workspace_id: str, forward_id: str | None, offset: int, limit: int
) -> list[LogEntry]:
    """Log entries newest first, optionally of one rule."""
    only = "" if forward_id is None else " AND forward_id = :fwd"
    rows = tx.all(
        f"SELECT * FROM forward_logs WHERE workspace_id = :ws{only}"
        " ORDER BY created_at DESC, id DESC LIMIT :limit OFFSET :offset",
        {"ws": workspace_id, "fwd": forward_id, "limit": limit, "offset": offset},
    )
    return [_entry(row) for row in rows]


def logs_count(tx: Tx, workspace_id: str, forward_id: str | None) -> int:
    only = "" if forward_id is None else " AND forward_id = :fwd"
    return int(
        tx.value(
            f"SELECT COUNT(*) FROM forward_logs WHERE workspace_id = :ws{only}",
            {"ws": workspace_id, "fwd": forward_id},
        )
    )


def counts_since(tx: Tx, workspace_id: str, since: datetime) -> dict[str, int]:
    """Forwarded copies per rule since a time."""
    rows = tx.all(
        "SELECT forward_id, COUNT(*) AS n FROM forward_logs WHERE workspace_id = :ws"
        " AND created_at >= :since GROUP BY forward_id",
        {"ws": workspace_id, "since": timestamp(since)},
    )
    return {row["forward_id"]: int(row["n"]) for row in rows}
