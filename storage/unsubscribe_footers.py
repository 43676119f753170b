"""Each workspace's footer for mail that offers unsubscribe but places no link itself
(engine/mail/unsubscribe_footer.py holds the rules and the default a workspace without a
row gets)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from storage.codec import in_list, parse_timestamp, timestamp
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class StoredFooter:
    enabled: bool
    text: str
    html: str
    updated_at: datetime


def _footer(row: Row) -> StoredFooter:
    return StoredFooter(
        bool(row["enabled"]),
        row["text_footer"],
        row["html_footer"],
        parse_timestamp(row["updated_at"]),
    )


def get(tx: Tx, workspace_id: str) -> StoredFooter | None:
    row = tx.one("SELECT * FROM unsubscribe_footers WHERE workspace_id = :ws", {"ws": workspace_id})
    return None if row is None else _footer(row)


def of_workspaces(tx: Tx, workspace_ids: Iterable[str]) -> dict[str, StoredFooter]:
    """The stored footers of these workspaces (those that have one), in one query."""
    wanted = sorted(set(workspace_ids))
    if not wanted:
        return {}
    names, params = in_list("w", wanted)
    rows = tx.all(f"SELECT * FROM unsubscribe_footers WHERE workspace_id IN ({names})", params)
    return {row["workspace_id"]: _footer(row) for row in rows}


def put(tx: Tx, workspace_id: str, footer: StoredFooter) -> None:
    """Store a workspace's footer, replacing the one it had."""
    tx.execute(
        "INSERT INTO unsubscribe_footers (workspace_id, enabled, text_footer, html_footer,"
        " updated_at) VALUES (:ws, :enabled, :text, :html, :at) ON CONFLICT (workspace_id)"
        " DO UPDATE SET enabled = excluded.enabled, text_footer = excluded.text_footer,"
        " html_footer = excluded.html_footer, updated_at = excluded.updated_at",
        {
            "ws": workspace_id,
            "enabled": footer.enabled,
            "text": footer.text,
            "html": footer.html,
            "at": timestamp(footer.updated_at),
        },
    )
