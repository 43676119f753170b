"""What the tables of reports received for a domain (DMARC aggregate reports, TLS reports)
share: room made for a report that arrives.

A report is kept once per domain: one sent again (same organisation and report id) replaces
the rows its earlier copy left; and a domain holds its recent reports only: rows of days
before `kept_since` go when a report arrives.
"""

from __future__ import annotations

from collections.abc import Collection
from datetime import date

from storage.tx import Tx

TABLES = frozenset({"dmarc_records", "tls_report_policies"})


def make_room(
    tx: Tx,
    table: str,
    workspace_id: str,
    domain_id: str,
    reports: Collection[tuple[str, str]],
    kept_since: date,
) -> None:
    """Delete a domain's rows of the `reports` (organisation, report id) about to be stored
    again, and its rows older than `kept_since`."""
    assert table in TABLES  # a name of ours, never a caller's input
    scope = {"ws": workspace_id, "domain": domain_id}
    where = "workspace_id = :ws AND domain_id = :domain"
    tx.execute(
        f"DELETE FROM {table} WHERE {where} AND day < :day", {**scope, "day": str(kept_since)}
    )
    for org_name, report_id in sorted(reports):
        tx.execute(
            f"DELETE FROM {table} WHERE {where} AND org_name = :org AND report_id = :report",
            {**scope, "org": org_name, "report": report_id},
        )
