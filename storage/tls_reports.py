"""The policies of SMTP TLS reports (RFC 8460) received for a workspace's domains.

Every read is scoped by workspace and domain; a report is kept once, recent ones only
(storage/received_reports.py).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import date, datetime

from storage.codec import new_id, timestamp
from storage.received_reports import make_room
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class PolicyResult:
    """How one organisation's sessions under one policy went on one day."""

    day: date
    org_name: str
    report_id: str
    policy_type: str  # sts, tlsa or no-policy-found
    policy_domain: str
    successful: int  # sessions
    failed: int
    failures: dict[str, int]  # failed sessions by result type (e.g. certificate-expired)


_COLUMNS = "day, org_name, report_id, policy_type, policy_domain, successful, failed, failures"


def store(
    tx: Tx,
    workspace_id: str,
    domain_id: str,
    results: Sequence[PolicyResult],
    kept_since: date,
    now: datetime,
) -> None:
    """Keep one report's policies for a domain, replacing an earlier copy of it."""
    reports = {(r.org_name, r.report_id) for r in results}
    make_room(tx, "tls_report_policies", workspace_id, domain_id, reports, kept_since)
    scope = {"ws": workspace_id, "domain": domain_id}
    tx.execute_many(
        f"INSERT INTO tls_report_policies (id, workspace_id, domain_id, received_at, {_COLUMNS})"
        " VALUES (:id, :ws, :domain, :at, :day, :org, :report, :type, :policy_domain,"
        " :successful, :failed, :failures)",
        [
            {
                **scope,
                "id": new_id(),
                "at": timestamp(now),
                "day": r.day.isoformat(),
                "org": r.org_name,
                "report": r.report_id,
                "type": r.policy_type,
                "policy_domain": r.policy_domain,
                "successful": r.successful,
                "failed": r.failed,
                "failures": json.dumps(r.failures, sort_keys=True),
            }
            for r in results
            if r.day >= kept_since
        ],
    )


def since(tx: Tx, workspace_id: str, domain_id: str, first_day: date) -> list[PolicyResult]:
    """The domain's policies of reports whose day is `first_day` or later."""
    rows = tx.all(
        f"SELECT {_COLUMNS} FROM tls_report_policies WHERE workspace_id = :ws"
        " AND domain_id = :domain AND day >= :day ORDER BY day, org_name, report_id, policy_domain",
        {"ws": workspace_id, "domain": domain_id, "day": first_day.isoformat()},
    )
    return [
        PolicyResult(
            day=date.fromisoformat(row["day"]),
            org_name=row["org_name"],
            report_id=row["report_id"],
            policy_type=row["policy_type"],
            policy_domain=row["policy_domain"],
            successful=int(row["successful"]),
            failed=int(row["failed"]),
            failures={str(k): int(v) for k, v in json.loads(row["failures"]).items()},
        )
        for row in rows
    ]
