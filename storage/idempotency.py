"""Stored first responses of requests sent with an Idempotency-Key, per workspace.

A claim whose request ended while the database was gone could be neither given back nor
settled with its response; its node's heartbeat would renew it for ever, and every retry
with that key would wait for ever. Such claims wait in the node's `Unsettled` until its next
beat that reaches the database settles them (`settle`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
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


def claim(
    tx: Tx,
    workspace_id: str,
    key: str,
    request_hash: str,
    node: str,
    now: datetime,
    until: datetime,
) -> str | None:
    """Claim a key for a request about to run: None when `node` now holds it (a new claim, or
    a stale one taken over), else the request hash of the live claim held elsewhere."""
    params = {
        "ws": workspace_id,
        "key": key,
        "hash": request_hash,
        "node": node,
        "now": timestamp(now),
        "until": timestamp(until),
    }
    if tx.execute(
        "INSERT INTO idempotency_claims (workspace_id, key, request_hash, claimed_by,"
        " claimed_until) VALUES (:ws, :key, :hash, :node, :until)"
        " ON CONFLICT (workspace_id, key) DO NOTHING",
        params,
    ):
        return None
    if tx.execute(  # its holder died (its heartbeat stopped renewing the claim)
        "UPDATE idempotency_claims SET request_hash = :hash, claimed_by = :node,"
        " claimed_until = :until WHERE workspace_id = :ws AND key = :key AND claimed_until < :now",
        params,
    ):
        return None
    held = tx.value(
        "SELECT request_hash FROM idempotency_claims WHERE workspace_id = :ws AND key = :key",
        params,
    )
    return None if held is None else str(held)


def unclaim(tx: Tx, workspace_id: str, key: str, node: str) -> None:
    """Give a claimed key back (its request ended: answered, stored or failed)."""
    tx.execute(
        "DELETE FROM idempotency_claims WHERE workspace_id = :ws AND key = :key"
        " AND claimed_by = :node",
        {"ws": workspace_id, "key": key, "node": node},
    )


@dataclass(slots=True)
class Unsettled:
    """Claims of this node whose request ended while the database was gone: by (workspace,
    key), the response to store, or None to give the claim back. Filled by the requests,
    emptied by the node's heartbeat (engine/platform/nodes.py); both on the Trio thread."""

    claims: dict[tuple[str, str], StoredResponse | None] = field(default_factory=dict)

    def take(self) -> dict[tuple[str, str], StoredResponse | None]:
        taken, self.claims = self.claims, {}
        return taken


def settle(tx: Tx, claims: dict[tuple[str, str], StoredResponse | None], node: str) -> None:
    """Store the responses and give back the claims of requests that ended in an outage."""
    for (workspace_id, key), stored in claims.items():
        if stored is not None:
            put(tx, workspace_id, key, stored)
        unclaim(tx, workspace_id, key, node)
