"""API keys: only a SHA-256 hash of each key is stored, looked up by that hash."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class ApiKey:
    id: str
    workspace_id: str
    created_by: str
    name: str
    key_prefix: str
    permissions: tuple[str, ...]
    is_active: bool
    last_used_at: datetime | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class KeyHolder:
    """Who an active key acts for: its workspace and the user who created it."""

    key_id: str
    key_hash: str
    workspace_id: str
    plan: str
    user_id: str
    user_email: str
    permissions: tuple[str, ...]
    last_used_at: datetime | None


def _key(row: Row) -> ApiKey:
    return ApiKey(
        id=row["id"],
        workspace_id=row["workspace_id"],
        created_by=row["created_by"],
        name=row["name"],
        key_prefix=row["key_prefix"],
        permissions=tuple(row["permissions"].split(",")),
        is_active=bool(row["is_active"]),
        last_used_at=parse_optional_timestamp(row["last_used_at"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(tx: Tx, key: ApiKey, key_hash: str) -> None:
    tx.execute(
        "INSERT INTO api_keys (id, workspace_id, created_by, name, key_hash, key_prefix,"
        " permissions, is_active, created_at)"
        " VALUES (:id, :workspace_id, :created_by, :name, :key_hash, :key_prefix,"
        " :permissions, TRUE, :created_at)",
        {
            "id": key.id,
            "workspace_id": key.workspace_id,
            "created_by": key.created_by,
            "name": key.name,
            "key_hash": key_hash,
            "key_prefix": key.key_prefix,
            "permissions": ",".join(key.permissions),
            "created_at": timestamp(key.created_at),
        },
    )


def count_active(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value(
            "SELECT COUNT(*) FROM api_keys WHERE workspace_id = :ws AND is_active",
            {"ws": workspace_id},
        )
    )


def list_active(tx: Tx, workspace_id: str) -> list[ApiKey]:
    rows = tx.all(
        "SELECT * FROM api_keys WHERE workspace_id = :ws AND is_active"
        " ORDER BY created_at DESC, id",
        {"ws": workspace_id},
    )
    return [_key(row) for row in rows]


def get_active(tx: Tx, workspace_id: str, key_id: str) -> ApiKey | None:
    row = tx.one(
        "SELECT * FROM api_keys WHERE workspace_id = :ws AND id = :id AND is_active",
        {"ws": workspace_id, "id": key_id},
    )
    return None if row is None else _key(row)


def deactivate(tx: Tx, workspace_id: str, key_id: str, at: datetime) -> bool:
    """Deactivate an active key of the workspace; False when there is none."""
    changed = tx.execute(
        "UPDATE api_keys SET is_active = FALSE, deactivated_at = :at"
        " WHERE workspace_id = :ws AND id = :id AND is_active",
        {"at": timestamp(at), "ws": workspace_id, "id": key_id},
    )
    return changed == 1


def holder_by_hash(tx: Tx, key_hash: str) -> KeyHolder | None:
    row = tx.one(
        "SELECT k.id, k.key_hash, k.workspace_id, k.permissions, k.last_used_at, w.plan,"
        " u.id AS user_id, u.email AS user_email"
        " FROM api_keys k JOIN workspaces w ON w.id = k.workspace_id"
        " JOIN users u ON u.id = k.created_by"
        " WHERE k.key_hash = :hash AND k.is_active",
        {"hash": key_hash},
    )
    if row is None:
        return None
    return KeyHolder(
        key_id=row["id"],
        key_hash=row["key_hash"],
        workspace_id=row["workspace_id"],
        plan=row["plan"],
        user_id=row["user_id"],
        user_email=row["user_email"],
        permissions=tuple(row["permissions"].split(",")),
        last_used_at=parse_optional_timestamp(row["last_used_at"]),
    )


def touch(tx: Tx, key_id: str, at: datetime) -> None:
    tx.execute(
        "UPDATE api_keys SET last_used_at = :at WHERE id = :id",
        {"at": timestamp(at), "id": key_id},
    )
