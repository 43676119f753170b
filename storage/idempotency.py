"""Stored first responses of requests sent with an Idempotency-Key, per workspace."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_timestamp, timestamp, to_json
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class StoredResponse:
    request_hash: str
    response: Any
    status_code: int
    created_at: datetime


def get(tx: Tx, workspace_id: str, key: str) -> StoredResponse | None:
    row = tx.one(
        "SELECT * FROM idempotency_keys WHERE workspace_id = :ws AND key = :key",
        {"ws": workspace_id, "key": key},
    )
    if row is None:
        return None
    return StoredResponse(
        row["request_hash"],
        from_json(row["response"]),
        int(row["status_code"]),
        parse_timestamp(row["created_at"]),
    )


def put(tx: Tx, workspace_id: str, key: str, stored: StoredResponse) -> None:
    """Store (or, once the old one has expired, replace) the response for a key."""
    tx.execute(
        "INSERT INTO idempotency_keys (workspace_id, key, request_hash, response, status_code,"
        " created_at) VALUES (:ws, :key, :hash, :response, :status, :at)"
        " ON CONFLICT (workspace_id, key) DO UPDATE SET request_hash = :hash,"
        " response = :response, status_code = :status, created_at = :at",
        {
            "ws": workspace_id,
            "key": key,
            "hash": stored.request_hash,
            "response": to_json(stored.response),
            "status": stored.status_code,
            "at": timestamp(stored.created_at),
        },
    )
