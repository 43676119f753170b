"""The SMTP TLS report the service sends a recipient domain for a day (RFC 8460), as data:
the JSON report (section 4), its gzip'd file and name (5.1), and the mail that carries it
to a `mailto:` rua (5.3). Pure: no I/O (engine/reports/tls_sender.py sends it).

Its figures are what delivery recorded: a delivered recipient is a successful session, a
deferral by the TLS policy (`reason: tls_policy`) a failed one for each MX host the policy
passed over, and so is a delivery under an MTA-STS policy whose certificate was not verified:
a `testing` policy delivers anyway, and RFC 8460 (and RFC 8461 5) wants that failure
reported (`validation-failure`: the event does not keep why). Other deferrals (a 4xx, a refused connection) are no TLS failure and are not
counted. Policies as the events name them: `mta-sts` is an `sts` policy, `opportunistic` and
`none` are `no-policy-found`, `dane` is a `tlsa` policy (without its `policy-string`: the
events do not keep the TLSA records); a policy this module does not know is left out of the
report (never reported as something it was not).
"""

from __future__ import annotations

import gzip
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from email.message import EmailMessage
from email.policy import SMTP
from email.utils import format_datetime, formataddr
from typing import Any

from storage.mta_sts import Cached
from storage.tls_rpt import Sessions

POLICY_TYPES = {
    "mta-sts": "sts",
    "opportunistic": "no-policy-found",
    "none": "no-policy-found",
    "dane": "tlsa",
}
CONTENT_TYPE = "application/tlsrpt+gzip"

# What a TLS failure's text says, to the result type of RFC 8460 4.3 (first match wins).
_RESULT_TYPES = (
    ("did not start TLS", "starttls-not-supported"),
    ("not listed by the MTA-STS policy", "validation-failure"),
    ("certificate has expired", "certificate-expired"),
    ("mismatch", "certificate-host-mismatch"),  # OpenSSL: Hostname (or IP address) mismatch
    ("self-signed", "certificate-not-trusted"),
    ("self signed", "certificate-not-trusted"),
    ("unable to get local issuer", "certificate-not-trusted"),
    ("TLSA", "tlsa-invalid"),
    ("DNSSEC", "dnssec-invalid"),
)
# One host a TLS policy passed over, in a deferral's response (engine/delivery/smtp_egress.py
# `_refused_by_policy`): `tls_policy: <host> [<address>]: <why>` or `tls_policy: <host> is …`.
_PASSED_OVER = re.compile(r"tls_policy: ([A-Za-z0-9._-]+)(?: \[([0-9A-Fa-f:.]+)\])?[: ]")


def result_type(text: str) -> str:
    """The RFC 8460 result type of one failed session, from why it failed."""
    for needle, kind in _RESULT_TYPES:
        if needle.lower() in text.lower():
            return kind
    return "validation-failure"


@dataclass(frozen=True, slots=True)
class Failure:
    result_type: str
    mx_host: str | None
    mx_address: str | None


def failures(response: str) -> list[Failure]:
    """The failed sessions one deferral by a TLS policy stands for: one per host passed over
    (its response joins their reasons with `; `)."""
    found = []
    for part in response.split("; "):
        match = _PASSED_OVER.search(part)
        if match is not None:
            found.append(Failure(result_type(part), match[1].lower().rstrip("."), match[2]))
    return found or [Failure(result_type(response), None, None)]


@dataclass(frozen=True, slots=True)
class Report:
    domain: str
    report_id: str
    submitter: str  # the reporting domain (the service's system mail domain)
    start: datetime
    end: datetime  # the last second of the day
    document: dict[str, Any]  # the JSON report

    @property
    def gzipped(self) -> bytes:
        body = json.dumps(self.document, separators=(",", ":")).encode()
        return gzip.compress(body, mtime=0)

    @property
    def filename(self) -> str:
        """RFC 8460 5.1: `sender!policy-domain!begin!end.json.gz` (seconds since 1970)."""
        begin, end = int(self.start.timestamp()), int(self.end.timestamp())
        return f"{self.submitter}!{self.domain}!{begin}!{end}.json.gz"

    @property
    def subject(self) -> str:
        """RFC 8460 5.3's subject."""
        return (
            f"Report Domain: {self.domain} Submitter: {self.submitter}"
            f" Report-ID: <{self.report_id}>"
        )


def _sts_policy(domain: str, cached: Cached | None) -> dict[str, Any]:
    policy: dict[str, Any] = {"policy-type": "sts", "policy-domain": domain}
    if cached is not None:  # the policy as fetched (kept while it is cached)
        policy["policy-string"] = [
            "version: STSv1",
            f"mode: {cached.mode}",
            *(f"mx: {mx}" for mx in cached.mx),
            f"max_age: {cached.max_age}",
        ]
        policy["mx-host"] = list(cached.mx)
    return policy


def build(
    domain: str,
    day: date,
    sessions: Sequence[Sessions],
    sts: Cached | None,
    submitter: str,
    contact: str,
) -> Report | None:
    """The report of `sessions` (all at `domain` on `day`); None when no policy it knows of
    was applied (nothing to report)."""
    start = datetime(day.year, day.month, day.day, tzinfo=UTC)
    end = start + timedelta(days=1, seconds=-1)
    # Per policy type: successes, failures, and the failures by (type, host, address).
    policies: dict[str, tuple[list[int], dict[tuple[str, str | None, str | None], int]]] = {}
    for each in sessions:
        kind = POLICY_TYPES.get(each.policy)
        if kind is None:
            continue
        counts, details = policies.setdefault(kind, ([0, 0], {}))
        if each.delivered and (each.verified or kind != "sts"):
            counts[0] += each.count
            continue
        # A delivery here is one a testing policy let through unverified: a failure.
        found = (
            [Failure("validation-failure", each.mx_host, None)]
            if each.delivered
            else failures(each.response or "")
        )
        for failure in found:
            counts[1] += each.count
            key = (failure.result_type, failure.mx_host, failure.mx_address)
            details[key] = details.get(key, 0) + each.count
    if not policies:
        return None
    report_id = f"{day.isoformat()}.{domain}@{submitter}"
    entries = []
    for kind in sorted(policies):
        (successful, failed), details = policies[kind]
        policy = (
            _sts_policy(domain, sts)
            if kind == "sts"
            else {"policy-type": kind, "policy-domain": domain}
        )
        entry: dict[str, Any] = {
            "policy": policy,
            "summary": {
                "total-successful-session-count": successful,
                "total-failure-session-count": failed,
            },
        }
        if details:
            entry["failure-details"] = [
                {"result-type": result}
                | ({"receiving-mx-hostname": host} if host else {})
                | ({"receiving-ip": address} if address else {})
                | {"failed-session-count": count}
                for (result, host, address), count in sorted(
                    details.items(),
                    key=lambda item: (item[0][0], item[0][1] or "", item[0][2] or ""),
                )
            ]
        entries.append(entry)
    document = {
        "organization-name": submitter,
        "date-range": {
            "start-datetime": start.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "end-datetime": end.strftime("%Y-%m-%dT%H:%M:%SZ"),
        },
        "contact-info": contact,
        "report-id": report_id,
        "policies": entries,
    }
    return Report(domain, report_id, submitter, start, end, document)


def mail(
    report: Report, from_address: str, from_name: str, to: str, message_id: str, now: datetime
) -> bytes:
    """The report as RFC 8460 5.3 mails it: multipart/report (report-type tlsrpt), a short
    text, then the gzip'd JSON as an `application/tlsrpt+gzip` attachment named as 5.1 says,
    with the TLS-Report-Domain and TLS-Report-Submitter fields. DKIM-signed on its way out,
    as all the service's mail is (engine/delivery/messages.py)."""
    message = EmailMessage(policy=SMTP)
    message["From"] = formataddr((from_name, from_address))
    message["To"] = to
    message["Subject"] = report.subject
    message["Date"] = format_datetime(now)
    message["Message-ID"] = message_id
    message["TLS-Report-Domain"] = report.domain
    message["TLS-Report-Submitter"] = report.submitter
    message.set_content(
        f"This is an aggregate TLS report (RFC 8460) from {report.submitter} about mail"
        f" delivered to {report.domain} on {report.start:%Y-%m-%d} (UTC).\n"
    )
    maintype, subtype = CONTENT_TYPE.split("/")
    message.add_attachment(
        report.gzipped, maintype=maintype, subtype=subtype, filename=report.filename
    )
    message.set_type("multipart/report")
    message.set_param("report-type", "tlsrpt")
    return message.as_bytes()
