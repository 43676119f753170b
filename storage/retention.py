"""Retention: the content of emails older than their workspace's retention period is deleted
(bodies, attachments, the raw message) while the row keeps its metadata and its events.

Work goes in bounded batches, one unit of work each, so a large backlog never holds the
writer long; `content_purged_at` marks what is done, so each email is purged once. Only
emails whose delivery is over are purged (a scheduled email may be older than the period).
"""

from __future__ import annotations

from datetime import datetime

from storage.codec import timestamp
from storage.tx import Tx

# Delivery is over for these: nothing will read the content to send it again.
_FINAL = ("delivered", "bounced", "failed", "rejected", "cancelled")


def workspaces(tx: Tx) -> list[tuple[str, str]]:
    """Every workspace with its plan."""
    return [(str(r["id"]), str(r["plan"])) for r in tx.all("SELECT id, plan FROM workspaces")]


def purge_batch(tx: Tx, workspace_id: str, before: datetime, limit: int, now: datetime) -> int:
    """Purge the content of at most `limit` of the workspace's finished emails created
    before `before`, oldest first; how many."""
    finals = ", ".join(f"'{status}'" for status in _FINAL)
    ids = [
        str(row["id"])
        for row in tx.all(
            "SELECT id FROM emails WHERE workspace_id = :ws AND content_purged_at IS NULL"
            f" AND created_at < :before AND status IN ({finals})"
            " ORDER BY created_at LIMIT :limit",
            {"ws": workspace_id, "before": timestamp(before), "limit": limit},
        )
    ]
    if not ids:
        return 0
    names = {f"i{n}": email_id for n, email_id in enumerate(ids)}
    within = ", ".join(f":{name}" for name in names)
    tx.execute(f"DELETE FROM email_attachments WHERE email_id IN ({within})", names)
    tx.execute(f"DELETE FROM raw_messages WHERE email_id IN ({within})", names)
    tx.execute(f"DELETE FROM sandbox_messages WHERE email_id IN ({within})", names)
    tx.execute(
        "UPDATE emails SET html = NULL, text_body = NULL, content_purged_at = :at"
        f" WHERE id IN ({within})",
        {**names, "at": timestamp(now)},
    )
    return len(ids)
