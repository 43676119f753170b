"""SMTP TLS reports (RFC 8460) mailed to the service: how other mail servers' sessions to a
domain's MX (the service's inbound MX, through the bounce domain) went.

A domain that publishes `_smtp._tls.<bounce domain>` TXT `v=TLSRPTv1;
rua=mailto:tls-rpt@<bounce domain>` receives them: the inbound MX accepts `tls-rpt@` of every
served domain (engine/forwarding/report_files.py; its hook in engine/forwarding/inbound.py:
`accepts` at RCPT, `read` before the message's unit of work, `store` inside it). A report is
JSON, gzip'd (`application/tlsrpt+gzip`) or not (`application/tlsrpt+json`), unpacked with
the same hard limits as DMARC reports. Each policy it holds is stored for the domain its
`policy-domain` is (or is a subdomain of), per reporting organisation and day; a report about
no domain its address serves, or one that is no report, is refused (550).
"""

from __future__ import annotations

import json
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from engine.domains import tls_rpt
from engine.forwarding import report_files
from engine.platform.errors import InvalidRequest, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import domains, tls_reports
from storage.tls_reports import PolicyResult
from storage.tx import Tx

ADDRESS = report_files.ReportAddress(tls_rpt.REPORTS_LOCAL_PART)
MAX_POLICIES = 1_000  # of one report
_TEXT = 255  # characters kept of a text field
_MAX_COUNT = 2**53  # sessions in one count: more is no real report
_JSON_TYPES = frozenset({"application/tlsrpt+json", "application/json"})


@dataclass(frozen=True, slots=True)
class Arrival:
    recipients: tuple[str, ...]  # its tls-rpt@ addresses
    results: tuple[PolicyResult, ...]  # the policies of every report it carries


def _field(value: Any, name: str, kind: type) -> Any:
    found = value.get(name) if isinstance(value, dict) else None
    if not isinstance(found, kind) or isinstance(found, bool):
        raise InvalidRequest(f"the TLS report has no {name} ({kind.__name__})")
    return found


def _text(value: Any, name: str) -> str:
    return " ".join(str(_field(value, name, str)).split())[:_TEXT]


def _count(value: Any, name: str) -> int:
    found = value.get(name, 0) if isinstance(value, dict) else 0
    if not isinstance(found, int) or isinstance(found, bool) or not 0 <= found <= _MAX_COUNT:
        raise InvalidRequest(f"the TLS report's {name} is not a count")
    return found


def _result(item: Any, org_name: str, report_id: str, day: date) -> PolicyResult:
    policy = _field(item, "policy", dict)
    summary = _field(item, "summary", dict)
    failures: dict[str, int] = {}
    details = item.get("failure-details", [])
    if not isinstance(details, list):
        raise InvalidRequest("the TLS report's failure-details is not a list")
    for detail in details:
        kind = _text(detail, "result-type")
        failures[kind] = failures.get(kind, 0) + _count(detail, "failed-session-count")
    return PolicyResult(
        day=day,
        org_name=org_name,
        report_id=report_id,
        policy_type=_text(policy, "policy-type"),
        policy_domain=_text(policy, "policy-domain").lower().rstrip("."),
        successful=_count(summary, "total-successful-session-count"),
        failed=_count(summary, "total-failure-session-count"),
        failures=failures,
    )


def parse(document: bytes) -> list[PolicyResult]:
    """One report's JSON, read (InvalidRequest when it is none)."""
    try:
        report = json.loads(document)
    except (ValueError, RecursionError) as error:
        raise InvalidRequest(f"the TLS report is not JSON: {error}") from None
    org_name = _text(report, "organization-name")
    report_id = _text(report, "report-id")
    start = _text(_field(report, "date-range", dict), "start-datetime")
    try:
        day = datetime.fromisoformat(start.replace("Z", "+00:00")).astimezone(UTC).date()
    except ValueError:
        raise InvalidRequest("the TLS report's start-datetime is not a time") from None
    policies = _field(report, "policies", list)
    if len(policies) > MAX_POLICIES:
        raise InvalidRequest(f"the TLS report has more than {MAX_POLICIES} policies")
    return [_result(item, org_name, report_id, day) for item in policies]


def read(recipients: Sequence[str], data: bytes) -> Arrival | None:
    """The message's tls-rpt@ recipients and the policies of the reports it carries, or None
    when it is to no tls-rpt@ address; InvalidRequest or PayloadTooLarge (the MX refuses it)
    when it carries no report that may be read. Pure: no database."""
    addressed = tuple(r for r in recipients if ADDRESS.domain(r) is not None)
    if not addressed:
        return None
    documents = report_files.documents(data, _JSON_TYPES, ".json", b"{")
    if not documents:
        raise InvalidRequest("the message carries no TLS report (gzip'd or plain JSON)")
    return Arrival(addressed, tuple(r for d in documents for r in parse(d)))


def store(tx: Tx, arrival: Arrival, forwarded: Collection[str], now: datetime) -> None:
    """Store each policy for the domain it is about, owned by the workspace whose served
    domain the report was sent to; in the caller's transaction. InvalidRequest when a policy
    is about no domain its address serves."""
    kept_since = now.astimezone(UTC).date() - timedelta(days=report_files.KEPT_DAYS)
    about = [r.policy_domain for r in arrival.results]
    for owner, mine in report_files.owned(
        tx, ADDRESS, arrival.recipients, forwarded, about, "TLS report"
    ):
        results = [arrival.results[i] for i in mine]
        tls_reports.store(tx, owner.workspace_id, owner.id, results, kept_since, now)


@dataclass(frozen=True, slots=True)
class Summary:
    range: str
    first_day: date
    reports: int
    results: list[PolicyResult]  # summed per organisation and policy, most sessions first


def _summed(results: Sequence[PolicyResult]) -> list[PolicyResult]:
    grouped: dict[tuple[str, str, str], list[PolicyResult]] = {}
    for r in results:
        grouped.setdefault((r.org_name, r.policy_type, r.policy_domain), []).append(r)
    summed = []
    for (org_name, policy_type, policy_domain), seen in grouped.items():
        failures: dict[str, int] = {}
        for r in seen:
            for kind, count in r.failures.items():
                failures[kind] = failures.get(kind, 0) + count
        summed.append(
            PolicyResult(
                day=min(r.day for r in seen),
                org_name=org_name,
                report_id="",
                policy_type=policy_type,
                policy_domain=policy_domain,
                successful=sum(r.successful for r in seen),
                failed=sum(r.failed for r in seen),
                failures=dict(sorted(failures.items())),
            )
        )
    return sorted(summed, key=lambda r: (-(r.successful + r.failed), r.org_name, r.policy_domain))


async def summary(rt: Runtime, who: Principal, domain_id: str, range_name: str) -> Summary:
    """The TLS reports received for one of the workspace's domains over a range
    (`report_files.RANGES`), per organisation and policy; NotFound for another's domain."""
    if await rt.db.read(domains.get, who.workspace_id, domain_id) is None:
        raise NotFound("domain not found")
    days = report_files.RANGES[range_name]
    first_day = rt.clock.now().astimezone(UTC).date() - timedelta(days=days)
    found = await rt.db.read(tls_reports.since, who.workspace_id, domain_id, first_day)
    reports = len({(r.org_name, r.report_id) for r in found})
    return Summary(range_name, first_day, reports, _summed(found))
