"""`/v1/domains/{id}/tls-reports`: what the SMTP TLS reports (RFC 8460) received for a
domain say (engine/forwarding/tls_reports.py): other servers' sessions to its MX per
reporting organisation and policy, with the failures by result type.

`success_rate` is the fraction of sessions that succeeded (0 to 1, four decimals), null when
no session was counted.
"""

from __future__ import annotations

from datetime import date
from typing import Any, Literal

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import query_args
from engine.forwarding import tls_reports

blueprint = Blueprint("tls_reports", __name__, url_prefix="/v1/domains")


class TlsReportsQuery(In):
    range: Literal["24h", "7d", "30d", "90d"] = "7d"


class Sessions(BaseModel):
    successful_sessions: int
    failed_sessions: int
    success_rate: float | None


class TlsPolicyOut(Sessions):
    org_name: str
    policy_type: str  # sts, tlsa or no-policy-found
    policy_domain: str
    failures: dict[str, int]  # failed sessions by result type


class TlsReportsSummary(Sessions):
    domain_id: str
    range: str
    since: date  # the first report day counted (UTC)
    reports: int
    policies: list[TlsPolicyOut]  # most sessions first


def _sessions(successful: int, failed: int) -> dict[str, Any]:
    total = successful + failed
    return {
        "successful_sessions": successful,
        "failed_sessions": failed,
        "success_rate": round(successful / total, 4) if total else None,
    }


@blueprint.get("/<id:domain_id>/tls-reports")
@query_args(TlsReportsQuery)
@document_response(TlsReportsSummary)
async def tls_report_summary(domain_id: str, query: TlsReportsQuery) -> dict[str, Any]:
    found = await tls_reports.summary(runtime(), principal(), domain_id, query.range)
    summary = TlsReportsSummary(
        domain_id=domain_id,
        range=found.range,
        since=found.first_day,
        reports=found.reports,
        policies=[
            TlsPolicyOut(
                org_name=r.org_name,
                policy_type=r.policy_type,
                policy_domain=r.policy_domain,
                failures=r.failures,
                **_sessions(r.successful, r.failed),
            )
            for r in found.results
        ],
        **_sessions(sum(r.successful for r in found.results), sum(r.failed for r in found.results)),
    )
    return summary.model_dump(mode="json")
