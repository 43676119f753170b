"""Broadcasts: one per bulk send to a contact list.

Status: `sending` while its emails are being queued, then `sent` (every email queued) or
`failed` (nothing could be queued, or queuing stopped on an error). `paused` (with a
`pause_reason`) while its waiting mail is held, until a person resumes it. `scheduled` is reserved
for broadcasts with a start time; `in_flight_for_domain` treats it like `sending`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import from_json, parse_optional_timestamp, parse_timestamp, timestamp, to_json
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Broadcast:
    id: str
    workspace_id: str
    contact_list_id: str
    sender_id: str
    domain_id: str
    from_address: str
    name: str  # the subject as written (before personalisation)
    tags: list[str]
    status: str
    queued: int
    skipped: int
    reserved: int  # emails counted against the month when it started
    node: str
    failure_reason: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    pause_reason: str | None = None


def _broadcast(row: Row) -> Broadcast:
    return Broadcast(
        id=row["id"],
        workspace_id=row["workspace_id"],
        contact_list_id=row["contact_list_id"],
        sender_id=row["sender_id"],
        domain_id=row["domain_id"],
        from_address=row["from_address"],
        name=row["subject"],
        tags=from_json(row["tags"]),
        status=row["status"],
        queued=int(row["queued"]),
        skipped=int(row["skipped"]),
        reserved=int(row["reserved"]),
        node=row["node"],
        failure_reason=row["failure_reason"],
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
        finished_at=parse_optional_timestamp(row["finished_at"]),
        pause_reason=row.get("pause_reason"),
    )


def insert(tx: Tx, broadcast: Broadcast) -> None:
    tx.execute(
        "INSERT INTO broadcasts (id, workspace_id, contact_list_id, sender_id, domain_id,"
        " from_address, subject, tags, status, queued, skipped, reserved, node, failure_reason,"
        " created_at, updated_at, finished_at) VALUES (:id, :ws, :list_id, :sender_id,"
        " :domain_id, :from_address, :subject, :tags, :status, :queued, :skipped, :reserved,"
        " :node, :failure_reason, :created_at, :updated_at, :finished_at)",
        {
            "id": broadcast.id,
            "ws": broadcast.workspace_id,
            "list_id": broadcast.contact_list_id,
            "sender_id": broadcast.sender_id,
            "domain_id": broadcast.domain_id,
            "from_address": broadcast.from_address,
            "subject": broadcast.name,
            "tags": to_json(broadcast.tags),
            "status": broadcast.status,
            "queued": broadcast.queued,
            "skipped": broadcast.skipped,
            "reserved": broadcast.reserved,
            "node": broadcast.node,
            "failure_reason": broadcast.failure_reason,
            "created_at": timestamp(broadcast.created_at),
            "updated_at": timestamp(broadcast.updated_at),
            "finished_at": None
            if broadcast.finished_at is None
            else timestamp(broadcast.finished_at),
        },
    )


def progress(tx: Tx, broadcast_id: str, queued: int, skipped: int, now: datetime) -> None:
    """Count one more committed chunk of a broadcast that is still sending."""
    tx.execute(
        "UPDATE broadcasts SET queued = queued + :queued, skipped = skipped + :skipped,"
        " updated_at = :now WHERE id = :id",
        {"queued": queued, "skipped": skipped, "now": timestamp(now), "id": broadcast_id},
    )


def finish(
    tx: Tx, broadcast_id: str, status: str, failure_reason: str | None, now: datetime
) -> None:
    """Record how a broadcast ended: `sent` or `failed` (a paused one stays paused)."""
    tx.execute(
        "UPDATE broadcasts SET status = CASE WHEN status = 'paused' THEN status ELSE :status END,"
        " failure_reason = :reason, updated_at = :now, finished_at = :now WHERE id = :id",
        {"status": status, "reason": failure_reason, "now": timestamp(now), "id": broadcast_id},
    )


def interrupted(tx: Tx, stale_before: datetime) -> list[Broadcast]:
    """Broadcasts left `sending` by a node that is no longer alive, or idle since a time."""
    rows = tx.all(
        "SELECT * FROM broadcasts WHERE status = 'sending'"
        " AND (node NOT IN (SELECT id FROM nodes WHERE state = 'alive') OR updated_at < :stale)"
        " ORDER BY created_at, id",
        {"stale": timestamp(stale_before)},
    )
    return [_broadcast(row) for row in rows]


def get(tx: Tx, workspace_id: str, broadcast_id: str) -> Broadcast | None:
    row = tx.one(
        "SELECT * FROM broadcasts WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": broadcast_id},
    )
    return None if row is None else _broadcast(row)


def page(tx: Tx, workspace_id: str, offset: int, limit: int) -> list[Broadcast]:
    """The workspace's broadcasts, newest first."""
    rows = tx.all(
        "SELECT * FROM broadcasts WHERE workspace_id = :ws"
        " ORDER BY created_at DESC, id DESC LIMIT :limit OFFSET :offset",
        {"ws": workspace_id, "limit": limit, "offset": offset},
    )
    return [_broadcast(row) for row in rows]


def in_flight_for_domain(tx: Tx, workspace_id: str, domain_id: str) -> list[Broadcast]:
    """Broadcasts from senders on the domain that are `sending` or `scheduled`, oldest first."""
    rows = tx.all(
        "SELECT * FROM broadcasts WHERE workspace_id = :ws AND domain_id = :domain"
        " AND status IN ('scheduled', 'sending') ORDER BY created_at, id",
        {"ws": workspace_id, "domain": domain_id},
    )
    return [_broadcast(row) for row in rows]


def pausable(tx: Tx, workspace_id: str, domain_id: str, waiting: Sequence[str]) -> list[Broadcast]:
    """The domain's broadcasts with recipients in a `waiting` status, oldest first."""
    states = {f"s{i}": status for i, status in enumerate(waiting)}
    rows = tx.all(
        "SELECT * FROM broadcasts b WHERE workspace_id = :ws AND domain_id = :domain"
        " AND status IN ('sending', 'sent') AND EXISTS (SELECT 1 FROM emails e"
        " JOIN email_recipients r ON r.email_id = e.id WHERE e.broadcast_id = b.id"
        f" AND r.status IN ({', '.join(f':{name}' for name in states)})) ORDER BY created_at, id",
        {"ws": workspace_id, "domain": domain_id, **states},
    )
    return [_broadcast(row) for row in rows]


def set_paused(tx: Tx, broadcast_id: str, reason: str | None, status: str, now: datetime) -> None:
    """Pause a broadcast for `reason`, or (reason None) put it back to `status`."""
    tx.execute(
        "UPDATE broadcasts SET status = :status, pause_reason = :reason, updated_at = :now"
        " WHERE id = :id",
        {"status": status, "reason": reason, "now": timestamp(now), "id": broadcast_id},
    )
