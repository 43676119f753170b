"""The complaint rate of a sending domain: complaints against, and deliveries of, the mail it
sent since a time, counted together (with the workspace's own pause rate) in one statement
whatever the volume; and that pause rate, a workspace setting."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import timestamp
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Counts:
    delivered: int  # recipients the mail reached
    complained: int  # complaints recorded against that mail
    pause_rate: float | None  # the workspace's own; None: the default


def since(tx: Tx, workspace_id: str, domain_id: str, start: datetime) -> Counts:
    """The domain's mail created from `start` on: recipients delivered and complaints."""
    row = tx.one(
        "SELECT (SELECT COUNT(*) FROM email_recipients r JOIN emails e ON e.id = r.email_id"
        "  WHERE e.workspace_id = :ws AND e.domain_id = :domain AND e.created_at >= :start"
        "  AND r.status = 'delivered') AS delivered,"
        " (SELECT COUNT(*) FROM email_events v JOIN emails e ON e.id = v.email_id"
        "  WHERE e.workspace_id = :ws AND e.domain_id = :domain AND e.created_at >= :start"
        "  AND v.event_type = 'complained') AS complained,"
        " (SELECT complaint_pause_rate FROM workspaces WHERE id = :ws) AS pause_rate",
        {"ws": workspace_id, "domain": domain_id, "start": timestamp(start)},
    )
    assert row is not None
    rate = row["pause_rate"]
    return Counts(
        int(row["delivered"]), int(row["complained"]), None if rate is None else float(rate)
    )


def pause_rate(tx: Tx, workspace_id: str) -> float | None:
    """The workspace's own pause rate; None: the default."""
    row = tx.one("SELECT complaint_pause_rate FROM workspaces WHERE id = :ws", {"ws": workspace_id})
    return (
        None
        if row is None or row["complaint_pause_rate"] is None
        else float(row["complaint_pause_rate"])
    )


def set_pause_rate(tx: Tx, workspace_id: str, rate: float | None) -> None:
    tx.execute(
        "UPDATE workspaces SET complaint_pause_rate = :rate WHERE id = :ws",
        {"rate": rate, "ws": workspace_id},
    )
