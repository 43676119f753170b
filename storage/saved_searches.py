"""Each user's saved email-log searches in a workspace, stored as one JSON list."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from storage.codec import from_json, timestamp, to_json
from storage.tx import Tx


def get(tx: Tx, workspace_id: str, user_id: str) -> list[dict[str, Any]]:
    value = tx.value(
        "SELECT searches FROM saved_searches WHERE workspace_id = :ws AND user_id = :user",
        {"ws": workspace_id, "user": user_id},
    )
    searches: list[dict[str, Any]] = [] if value is None else from_json(value)
    return searches


def replace(
    tx: Tx, workspace_id: str, user_id: str, searches: list[dict[str, Any]], now: datetime
) -> None:
    tx.execute(
        "INSERT INTO saved_searches (workspace_id, user_id, searches, updated_at)"
        " VALUES (:ws, :user, :searches, :now) ON CONFLICT (workspace_id, user_id)"
        " DO UPDATE SET searches = :searches, updated_at = :now",
        {"ws": workspace_id, "user": user_id, "searches": to_json(searches), "now": timestamp(now)},
    )
