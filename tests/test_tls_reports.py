"""SMTP TLS reports (RFC 8460) mailed to tls-rpt@ of a served domain, through the real MX over
SMTP: Google's and Microsoft's (gzip'd JSON, tests/dmarc_reports/*-tlsrpt.json, dated
yesterday) read back through `GET /v1/domains/{id}/tls-reports`; reports about another
domain or that are no JSON are refused. Unpacking is DMARC's (tests/test_dmarc_reports.py
has its bombs).
"""

from __future__ import annotations

import gzip
import json
from datetime import UTC, datetime, timedelta
from typing import Any

from tests.harness.bounce_domain import BOUNCE_DOMAIN, with_bounce_domain
from tests.harness.dns_server import DnsServer
from tests.harness.reports import FIXTURES, report_mail, send
from tests.harness.service import Service

RUA = f"tls-rpt@{BOUNCE_DOMAIN}"


def dated(name: str, day: datetime, **changes: Any) -> bytes:
    report = json.loads((FIXTURES / name).read_text())
    start = day.strftime("%Y-%m-%dT00:00:00Z")
    report["date-range"] = {"start-datetime": start, "end-datetime": start[:11] + "23:59:59Z"}
    report.update(changes)
    return json.dumps(report).encode()


def tls_mail(org: str, report: bytes, *, compress: bool = True) -> bytes:
    kind = "application/tlsrpt+gzip" if compress else "application/tlsrpt+json"
    name = f"{org}!{BOUNCE_DOMAIN}!1764115200!1764201599!001.json" + (".gz" if compress else "")
    content = gzip.compress(report) if compress else report
    return report_mail(org, f"tlsrpt@{org}", content, kind, name, to=RUA)


async def test_tls_reports_from_google_and_microsoft_are_summed_per_policy(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    day = datetime.now(UTC) - timedelta(days=1)
    microsoft = tls_mail("microsoft.com", dated("microsoft-tlsrpt.json", day))
    for data in (tls_mail("google.com", dated("google-tlsrpt.json", day)), microsoft, microsoft):
        code, reply = await send(service, data, [RUA])
        assert code == 250, reply
    path = f"/v1/domains/{domain['id']}/tls-reports"
    body = (await account.client.get(path, params={"range": "7d"})).json()
    assert (body["reports"], body["successful_sessions"], body["failed_sessions"]) == (2, 72, 3)
    assert body["success_rate"] == round(72 / 75, 4)
    rows = [
        (p["org_name"], p["policy_type"], p["successful_sessions"], p["failed_sessions"])
        for p in body["policies"]
    ]
    assert rows == [
        ("Google Inc.", "no-policy-found", 42, 0),
        ("Microsoft Corporation", "sts", 30, 3),
    ]
    assert body["policies"][1]["failures"] == {
        "certificate-expired": 2,
        "starttls-not-supported": 1,
    }
    assert body["policies"][0]["policy_domain"] == BOUNCE_DOMAIN
    # Scoped to the workspace, its query checked.
    other = await service.account("starter")
    assert (await other.client.get(path)).status_code == 404
    refused = await account.client.get(path, params={"range": "7d", "page": "2"})
    assert refused.status_code == 422, refused.text


async def test_what_is_no_tls_report_for_the_addresses_domain_is_refused(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    day = datetime.now(UTC) - timedelta(days=1)
    report = json.loads(dated("google-tlsrpt.json", day))
    report["policies"][0]["policy"]["policy-domain"] = "other.example"
    cases = {
        "other.example": tls_mail("google.com", json.dumps(report).encode(), compress=False),
        "not JSON": tls_mail("google.com", b"{not json"),
        "no organization-name": tls_mail("google.com", b"{}", compress=False),
    }
    for expected, data in cases.items():
        code, reply = await send(service, data, [RUA])
        assert (code, expected in reply) == (550, True), reply
    code, _ = await send(service, cases["not JSON"], ["tls-rpt@not-served.example"])
    assert code == 550
    body = (await account.client.get(f"/v1/domains/{domain['id']}/tls-reports")).json()
    assert (body["reports"], body["policies"], body["success_rate"]) == (0, [], None)
