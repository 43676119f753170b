"""Inbound messages the MX listener accepted and the forwarding work each one makes.

A message is stored with one job per destination (an email address or a URL) of every
active forward it was addressed to, in the transaction that commits it, so the listener's
250 means the work exists. The forwarder claims due jobs with leases (`FOR UPDATE SKIP
LOCKED` on PostgreSQL), as delivery does: two nodes never run one job, and a dead node's
leases lapse. The raw message is kept as it came (`content`, BYTEA), so storing it holds no
second copy; rows from before migration 0026 have it as base64 text (`data`). Claiming
jobs reads their messages without the content (`messages(..., content=False)`): the forwarder
reads one message's content when its memory budget has room (`content`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import (
    from_json,
    new_id,
    parse_timestamp,
    timestamp,
    to_json,
)
from storage.leases import Claimed, FaultPolicy, LeasedTable
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class InboundMessage:
    id: str
    envelope_from: str
    recipients: list[str]
    data: bytes  # empty when read without the content
    received_at: datetime
    size: int = 0  # octets of the message


@dataclass(frozen=True, slots=True)
class Job:
    """One destination of one forward for one inbound message."""

    id: str
    message_id: str
    forward_id: str
    workspace_id: str
    original_to: str
    kind: str  # "email" or "url"
    target: str
    attempt: int


@dataclass(frozen=True, slots=True)
class NewJob:
    forward_id: str
    workspace_id: str
    original_to: str
    kind: str
    target: str


@dataclass(frozen=True, slots=True)
class Outcome:
    """What became of one attempt at a job: `done`, `retrying` (with a time) or `failed`."""

    job_id: str
    status: str
    next_attempt_at: datetime | None
    error: str | None


def insert_message(
    tx: Tx,
    envelope_from: str,
    recipients: Sequence[str],
    data: bytes,
    jobs: Sequence[NewJob],
    now: datetime,
) -> str:
    """Store one accepted message and its jobs (all due now); its id."""
    message_id = new_id()
    at = timestamp(now)
    tx.execute(
        "INSERT INTO inbound_messages (id, envelope_from, recipients, data, content, size_bytes,"
        " received_at) VALUES (:id, :sender, :rcpts, '', :content, :size, :at)",
        {
            "id": message_id,
            "sender": envelope_from,
            "rcpts": to_json(list(recipients)),
            "content": data if tx.inline_octets(data) else b"",
            "size": len(data),
            "at": at,
        },
    )
    if not tx.inline_octets(data):
        tx.write_octets("inbound_messages", "content", "id", message_id, data)
    tx.execute_many(
        "INSERT INTO forward_jobs (id, message_id, forward_id, workspace_id, original_to, kind,"
        " target, status, attempt, next_attempt_at, created_at, updated_at) VALUES (:id, :msg,"
        " :fwd, :ws, :to, :kind, :target, 'pending', 0, :at, :at, :at)",
        (
            {
                "id": new_id(),
                "msg": message_id,
                "fwd": job.forward_id,
                "ws": job.workspace_id,
                "to": job.original_to,
                "kind": job.kind,
                "target": job.target,
                "at": at,
            }
            for job in jobs
        ),
    )
    tx.notify("forwards")
    return message_id


def messages(
    tx: Tx, message_ids: Sequence[str], *, content: bool = True
) -> tuple[dict[str, InboundMessage], dict[str, str]]:
    """The messages with these ids, in one query (without their octets unless `content`);
    and why each of the others cannot be had (gone, or a stored row that cannot be read)."""
    if not message_ids:
        return {}, {}
    names = {f"id{i}": message_id for i, message_id in enumerate(set(message_ids))}
    placeholders = ", ".join(f":{name}" for name in names)
    columns = "*" if content else "id, envelope_from, recipients, size_bytes, received_at"
    rows = tx.all(f"SELECT {columns} FROM inbound_messages WHERE id IN ({placeholders})", names)
    found: dict[str, InboundMessage] = {}
    missing = {message_id: "the inbound message is gone" for message_id in names.values()}
    for row in rows:
        try:
            found[row["id"]] = _message(row)
            del missing[row["id"]]
        except Exception as exc:  # a row no code can read: its jobs must not be claimed forever
            missing[row["id"]] = f"the stored message cannot be read: {exc!r}"
    return found, missing


def content_of(row: Row) -> bytes:
    """The octets of a message row read with its `content` and `data` columns."""
    if row["content"] is not None:
        return bytes(row["content"])
    return base64.b64decode(row["data"])  # stored before migration 0026


def _message(row: Row) -> InboundMessage:
    return InboundMessage(
        id=row["id"],
        envelope_from=row["envelope_from"],
        recipients=from_json(row["recipients"]),
        data=content_of(row) if "content" in row else b"",
        received_at=parse_timestamp(row["received_at"]),
        size=int(row["size_bytes"]),
    )


def content(tx: Tx, message_id: str) -> bytes | None:
    """The octets of one message, or None when it is gone."""
    row = tx.octets("SELECT content, data FROM inbound_messages WHERE id = :id", {"id": message_id})
    return None if row is None else content_of(row)


def _job(row: Row) -> Job:
    return Job(
        id=row["id"],
        message_id=row["message_id"],
        forward_id=row["forward_id"],
        workspace_id=row["workspace_id"],
        original_to=row["original_to"],
        kind=row["kind"],
        target=row["target"],
        attempt=int(row["attempt"]),
    )


JOBS = LeasedTable("forward_jobs", "next_attempt_at", "failed", "last_error")


def claim_due(
    tx: Tx, now: datetime, lease_until: datetime, node: str, limit: int, faults: FaultPolicy
) -> Claimed[Job]:
    """Lease up to `limit` due jobs."""
    return JOBS.claim_due(tx, now, lease_until, node, limit, _job, faults)


def record_outcomes(tx: Tx, outcomes: Sequence[Outcome], now: datetime) -> None:
    """Write what became of attempted jobs and release their leases."""
    tx.execute_many(
        "UPDATE forward_jobs SET status = :status, attempt = attempt + 1, next_attempt_at = :next,"
        " last_error = :error, lease_until = NULL, leased_by = NULL, updated_at = :at"
        " WHERE id = :id",
        (
            {
                "status": o.status,
                "next": None if o.next_attempt_at is None else timestamp(o.next_attempt_at),
                "error": o.error,
                "at": timestamp(now),
                "id": o.job_id,
            }
            for o in outcomes
        ),
    )


def finish(tx: Tx, message_ids: Sequence[str]) -> int:
    """Delete those of these messages that have no unfinished job left; how many."""
    if not message_ids:
        return 0
    names = {f"id{i}": message_id for i, message_id in enumerate(set(message_ids))}
    placeholders = ", ".join(f":{name}" for name in names)
    return tx.execute(
        f"DELETE FROM inbound_messages WHERE id IN ({placeholders}) AND NOT EXISTS (SELECT 1"
        " FROM forward_jobs j WHERE j.message_id = inbound_messages.id"
        " AND j.status IN ('pending', 'retrying'))",
        names,
    )
