"""The complaint rate of a sending domain: complaints against, and deliveries of, the mail it
sent since a time, counted together in one statement whatever the volume."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import timestamp
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Counts:
    delivered: int  # recipients the mail reached
    complained: int  # complaints recorded against that mail


def since(tx: Tx, workspace_id: str, domain_id: str, start: datetime) -> Counts:
    """The domain's mail created from `start` on: recipients delivered and complaints."""
    row = tx.one(
        "SELECT (SELECT COUNT(*) FROM email_recipients r JOIN emails e ON e.id = r.email_id"
        "  WHERE e.workspace_id = :ws AND e.domain_id = :domain AND e.created_at >= :start"
        "  AND r.status = 'delivered') AS delivered,"
        " (SELECT COUNT(*) FROM email_events v JOIN emails e ON e.id = v.email_id"
        "  WHERE e.workspace_id = :ws AND e.domain_id = :domain AND e.created_at >= :start"
        "  AND v.event_type = 'complained') AS complained",
        {"ws": workspace_id, "domain": domain_id, "start": timestamp(start)},
    )
    assert row is not None
    return Counts(int(row["delivered"]), int(row["complained"]))
