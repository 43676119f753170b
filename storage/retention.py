"""Retention: the content of emails older than their workspace's retention period is deleted
(bodies, attachments, the raw message) while the row keeps its metadata and its events, and
so are the inbound messages kept for forwarding (their jobs and logs stay as the record).

Work goes in bounded batches, one unit of work each, so a large backlog never holds the
writer long; `content_purged_at` marks what is done, so each email is purged once. Only
emails whose delivery is over are purged (a scheduled email may be older than the period).
Every statement is conditional on what it changes, so two nodes sweeping at once (a brief
overlap of the leadership) do no harm.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage import inbound
from storage.codec import timestamp
from storage.tx import Row, Tx

# Delivery is over for these: nothing will read the content to send it again.
_FINAL = ("delivered", "bounced", "failed", "rejected", "cancelled")


@dataclass(frozen=True, slots=True)
class WorkspaceRetention:
    """A workspace's plan and its own period in days (None: the plan's)."""

    workspace_id: str
    plan: str
    days: int | None


def _retention(row: Row) -> WorkspaceRetention:
    days = row["retention_days"]
    return WorkspaceRetention(str(row["id"]), str(row["plan"]), None if days is None else int(days))


def workspaces(tx: Tx) -> list[WorkspaceRetention]:
    """Every workspace with its plan and own period."""
    return [_retention(r) for r in tx.all("SELECT id, plan, retention_days FROM workspaces")]


def workspace(tx: Tx, workspace_id: str) -> WorkspaceRetention:
    """One workspace's plan and own period."""
    row = tx.one(
        "SELECT id, plan, retention_days FROM workspaces WHERE id = :ws", {"ws": workspace_id}
    )
    assert row is not None, "the principal's workspace exists"
    return _retention(row)


def set_days(tx: Tx, workspace_id: str, days: int | None) -> None:
    """Set the workspace's own period (None: back to its plan's)."""
    tx.execute(
        "UPDATE workspaces SET retention_days = :days WHERE id = :ws",
        {"days": days, "ws": workspace_id},
    )


def purge_batch(tx: Tx, workspace_id: str, before: datetime, limit: int, now: datetime) -> int:
    """Purge the content of at most `limit` of the workspace's finished emails created
    before `before`, oldest first; how many. The sandbox's captured requests of that age
    go with them."""
    tx.execute(
        "DELETE FROM sandbox_posts WHERE workspace_id = :ws AND created_at < :before",
        {"ws": workspace_id, "before": timestamp(before)},
    )
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


# Said on a forward job whose message the sweeper deleted before the job could finish.
EXPIRED_JOB_ERROR = "not forwarded: the message passed the workspace's retention period"


def purge_inbound_batch(
    tx: Tx, workspace_id: str, before: datetime, limit: int, now: datetime
) -> int:
    """Delete at most `limit` stored inbound messages received before `before` that this
    workspace forwards; how many were deleted.

    The workspace's jobs still waiting on such a message (and not leased by a node at work
    on them) fail, saying why. A message another workspace's forward is still working on
    stays until that workspace's own period or its work ends (storage/inbound.finish).
    """
    ids = [
        str(row["id"])
        for row in tx.all(
            "SELECT m.id FROM inbound_messages m WHERE m.received_at < :before AND EXISTS"
            " (SELECT 1 FROM forward_jobs j WHERE j.message_id = m.id AND j.workspace_id = :ws)"
            " ORDER BY m.received_at LIMIT :limit",
            {"ws": workspace_id, "before": timestamp(before), "limit": limit},
        )
    ]
    if not ids:
        return 0
    names = {f"i{n}": message_id for n, message_id in enumerate(ids)}
    within = ", ".join(f":{name}" for name in names)
    at = timestamp(now)
    tx.execute(
        "UPDATE forward_jobs SET status = 'failed', next_attempt_at = NULL, last_error = :why,"
        f" updated_at = :at WHERE message_id IN ({within}) AND workspace_id = :ws"
        " AND status IN ('pending', 'retrying') AND (lease_until IS NULL OR lease_until < :at)",
        {**names, "ws": workspace_id, "why": EXPIRED_JOB_ERROR, "at": at},
    )
    return inbound.finish(tx, ids)
