"""The outstanding work, counted: recipients still to deliver per domain, emails waiting, and
webhook deliveries still to POST. Read by `/metrics` at scrape time and by the shutdown log.

Each count is one GROUP BY over an index whose first column is the status, so it reads the
index alone and never the rows (a million queued recipients count in a fraction of a second).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from storage import incidents
from storage.tx import Tx

WAITING_EMAIL = ("scheduled", "queued", "deferred", "held")
WAITING_RECIPIENT = ("queued", "deferred", "held")
WAITING_WEBHOOK = ("pending", "retrying")


@dataclass(frozen=True, slots=True)
class Backlog:
    # (recipient domain, status) -> recipients in that state
    recipients: dict[tuple[str, str], int]
    # status -> emails in that state (scheduled, queued, deferred)
    emails: dict[str, int]
    # status -> webhook deliveries in that state (pending, retrying)
    webhook_deliveries: dict[str, int]
    # (destination, kind) -> open destination incidents (storage/incidents.py)
    incidents: dict[tuple[str, str], int] = field(default_factory=dict)


def _in(values: tuple[str, ...]) -> str:
    return ", ".join(f"'{value}'" for value in values)


def read(tx: Tx) -> Backlog:
    """Everything still to do, counted by state."""
    recipients = {
        (row["domain"], row["status"]): int(row["n"])
        for row in tx.all(
            "SELECT status, domain, COUNT(*) AS n FROM email_recipients"
            f" WHERE status IN ({_in(WAITING_RECIPIENT)}) GROUP BY status, domain"
        )
    }
    emails = {
        row["status"]: int(row["n"])
        for row in tx.all(
            "SELECT status, COUNT(*) AS n FROM emails"
            f" WHERE status IN ({_in(WAITING_EMAIL)}) GROUP BY status"
        )
    }
    webhook_deliveries = {
        row["status"]: int(row["n"])
        for row in tx.all(
            "SELECT status, COUNT(*) AS n FROM webhook_deliveries"
            f" WHERE status IN ({_in(WAITING_WEBHOOK)}) GROUP BY status"
        )
    }
    return Backlog(recipients, emails, webhook_deliveries, incidents.open_counts(tx))
