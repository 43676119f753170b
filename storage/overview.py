"""A workspace at a glance: its email events counted over time, what waits, dead webhooks.

Events are counted for the emails sent in the range (found through the emails' workspace
index, then each one's events), so no index is added to the event table's hot insert path.
"""

from __future__ import annotations

from datetime import datetime

from storage.codec import timestamp
from storage.tx import Tx

COUNTED = ("sent", "delivered", "bounced", "complained")


def event_counts(
    tx: Tx, workspace_id: str, since: datetime, bucket_chars: int
) -> dict[tuple[str, str], int]:
    """(event type, time bucket) -> events since `since`; a bucket is the first
    `bucket_chars` characters of the stored timestamp (13: the hour, 10: the day)."""
    kinds = ", ".join(f"'{kind}'" for kind in COUNTED)
    rows = tx.all(
        f"SELECT e.event_type AS kind, SUBSTR(e.created_at, 1, {int(bucket_chars)}) AS bucket,"
        " COUNT(*) AS n FROM emails m JOIN email_events e ON e.email_id = m.id"
        " WHERE m.workspace_id = :ws AND m.created_at >= :since AND e.created_at >= :since"
        f" AND e.event_type IN ({kinds}) GROUP BY 1, 2",
        {"ws": workspace_id, "since": timestamp(since)},
    )
    return {(str(row["kind"]), str(row["bucket"])): int(row["n"]) for row in rows}


def backlog(tx: Tx, workspace_id: str) -> list[tuple[str, str, int]]:
    """(recipient domain, status, recipients) still to deliver, largest first."""
    rows = tx.all(
        "SELECT r.domain, r.status, COUNT(*) AS n FROM email_recipients r"
        " JOIN emails m ON m.id = r.email_id WHERE m.workspace_id = :ws"
        " AND r.status IN ('queued', 'deferred', 'held') GROUP BY r.domain, r.status"
        " ORDER BY 3 DESC, 1, 2",
        {"ws": workspace_id},
    )
    return [(str(row["domain"]), str(row["status"]), int(row["n"])) for row in rows]


def dead_webhook_deliveries(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value(
            "SELECT COUNT(*) FROM webhook_deliveries WHERE workspace_id = :ws AND status = 'dead'",
            {"ws": workspace_id},
        )
    )
