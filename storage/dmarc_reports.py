"""The rows of DMARC aggregate reports received for a workspace's domains, and what the
service itself delivered of a domain's mail per day, to set beside them.

Every read is scoped by workspace and domain; a report is kept once, recent ones only
(storage/received_reports.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta

from storage.codec import new_id, timestamp
from storage.received_reports import make_room
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Record:
    """One row of a report: what one organisation saw from one source on one day."""

    day: date
    org_name: str
    report_id: str
    source_ip: str
    message_count: int
    header_from: str
    disposition: str
    dkim_pass: bool  # DKIM passed aligned, as the receiver evaluated it
    spf_pass: bool  # SPF passed aligned, likewise


_FIELDS = (
    "day, org_name, report_id, source_ip, message_count, header_from, disposition, dkim_pass,"
    " spf_pass"
)


def replace(
    tx: Tx,
    workspace_id: str,
    domain_id: str,
    records: Sequence[Record],
    kept_since: date,
    now: datetime,
) -> None:
    """Store one report's rows for a domain, in place of an earlier copy of that report;
    the domain's rows older than `kept_since` go."""
    reports = {(r.org_name, r.report_id) for r in records}
    make_room(tx, "dmarc_records", workspace_id, domain_id, reports, kept_since)
    tx.execute_many(
        f"INSERT INTO dmarc_records (id, workspace_id, domain_id, received_at, {_FIELDS})"
        " VALUES (:id, :ws, :domain, :at, :day, :org, :report, :ip, :count, :header_from,"
        " :disposition, :dkim, :spf)",
        [
            {
                "id": new_id(),
                "ws": workspace_id,
                "domain": domain_id,
                "at": timestamp(now),
                "day": r.day.isoformat(),
                "org": r.org_name,
                "report": r.report_id,
                "ip": r.source_ip,
                "count": r.message_count,
                "header_from": r.header_from,
                "disposition": r.disposition,
                "dkim": r.dkim_pass,
                "spf": r.spf_pass,
            }
            for r in records
            if r.day >= kept_since
        ],
    )


def since(tx: Tx, workspace_id: str, domain_id: str, first_day: date) -> list[Record]:
    """The domain's rows for reports whose day is `first_day` or later."""
    rows = tx.all(
        f"SELECT {_FIELDS} FROM dmarc_records WHERE workspace_id = :ws AND domain_id = :domain"
        " AND day >= :day ORDER BY day, org_name, report_id, source_ip",
        {"ws": workspace_id, "domain": domain_id, "day": first_day.isoformat()},
    )
    return [
        Record(
            day=date.fromisoformat(row["day"]),
            org_name=row["org_name"],
            report_id=row["report_id"],
            source_ip=row["source_ip"],
            message_count=int(row["message_count"]),
            header_from=row["header_from"],
            disposition=row["disposition"],
            dkim_pass=bool(row["dkim_pass"]),
            spf_pass=bool(row["spf_pass"]),
        )
        for row in rows
    ]


# Mail is delivered at the latest 72 hours after it was queued: its emails are looked for
# from this long before the first day on (through the emails' workspace index).
_QUEUED_BEFORE = timedelta(days=4)


def delivered_by_day(tx: Tx, workspace_id: str, domain_id: str, first_day: date) -> dict[date, int]:
    """Recipients of the domain's mail the service delivered, per UTC day, from `first_day` on
    (one statement; no index added to the event table's hot insert path)."""
    start = datetime(first_day.year, first_day.month, first_day.day, tzinfo=UTC)
    rows = tx.all(
        "SELECT SUBSTR(v.created_at, 1, 10) AS day, COUNT(*) AS n"
        " FROM emails m JOIN email_events v ON v.email_id = m.id"
        " WHERE m.workspace_id = :ws AND m.created_at >= :queued AND m.domain_id = :domain"
        " AND v.created_at >= :start AND v.event_type = 'delivered' GROUP BY 1",
        {
            "ws": workspace_id,
            "domain": domain_id,
            "queued": timestamp(start - _QUEUED_BEFORE),
            "start": timestamp(start),
        },
    )
    return {date.fromisoformat(str(row["day"])): int(row["n"]) for row in rows}
