"""The append-only workspace activity log."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_timestamp, timestamp, to_json
from storage.engines import in_one_snapshot
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class ActivityEntry:
    id: str
    workspace_id: str
    actor: str
    action: str
    target_type: str
    target_name: str
    target_id: str | None
    category: str
    meta: dict[str, Any]
    created_at: datetime


def append(tx: Tx, entry: ActivityEntry) -> None:
    tx.execute(
        "INSERT INTO activity_log (id, workspace_id, actor, action, target_type, target_name,"
        " target_id, category, meta, created_at) VALUES (:id, :ws, :actor, :action,"
        " :target_type, :target_name, :target_id, :category, :meta, :created_at)",
        {
            "id": entry.id,
            "ws": entry.workspace_id,
            "actor": entry.actor,
            "action": entry.action,
            "target_type": entry.target_type,
            "target_name": entry.target_name,
            "target_id": entry.target_id,
            "category": entry.category,
            "meta": to_json(entry.meta),
            "created_at": timestamp(entry.created_at),
        },
    )


@in_one_snapshot
def newest(
    tx: Tx, workspace_id: str, since: datetime, category: str | None, limit: int
) -> tuple[list[ActivityEntry], int]:
    """Entries since a time, newest first, at most `limit`; and how many there are in all."""
    where = "workspace_id = :ws AND created_at >= :since"
    params: dict[str, Any] = {"ws": workspace_id, "since": timestamp(since), "limit": limit}
    if category is not None:
        where += " AND category = :category"
        params["category"] = category
    total = int(tx.value(f"SELECT COUNT(*) FROM activity_log WHERE {where}", params))
    rows = tx.all(
        f"SELECT * FROM activity_log WHERE {where} ORDER BY created_at DESC, id DESC LIMIT :limit",
        params,
    )
    entries = [
        ActivityEntry(
            id=row["id"],
            workspace_id=row["workspace_id"],
            actor=row["actor"],
            action=row["action"],
            target_type=row["target_type"],
            target_name=row["target_name"],
            target_id=row["target_id"],
            category=row["category"],
            meta=from_json(row["meta"]),
            created_at=parse_timestamp(row["created_at"]),
        )
        for row in rows
    ]
    return entries, total
