"""A domain's SMTP TLS reporting record (RFC 8460 section 3): `_smtp._tls.<domain>` TXT
`v=TLSRPTv1; rua=<uri>[,<uri>]`, read the same way for both of its uses.

Guidance: a sending domain is advised to publish one whose `rua` is `mailto:tls-rpt@` its bounce
domain (or the domain itself), so the reports other senders make about its MX reach the TLS
reports the service already reads (engine/forwarding/tls_reports.py); `check` says whether it
is there. Sending: the service's own reports go to the `rua` of each recipient domain that
publishes one (engine/reports/tls_sender.py).

Rules of the RFC: TXT records not beginning with `v=TLSRPTv1` are discarded, and unless exactly
one is left the domain does not take reports; `rua` lists `mailto:` and `https:` URIs, separated
by commas; fields are separated by semicolons, and unknown fields are ignored.
"""

from __future__ import annotations

import re

from engine.domains.findings import INVALID, MISSING, PENDING, VERIFIED, Finding
from engine.platform import dns
from engine.platform.runtime import Runtime

PURPOSE = "tls_rpt"
# The local part the guidance's `rua` names; the inbound MX reads the reports sent to it
# (engine/forwarding/tls_reports.py), which builds on this, not the other way round.
REPORTS_LOCAL_PART = "tls-rpt"
_VERSION = re.compile(r"^\s*v\s*=\s*TLSRPTv1\s*(;|$)")
_URI = re.compile(r"(mailto:[^\s@,;!]+@[A-Za-z0-9.-]+|https://[!-~]+)", re.IGNORECASE)


class InvalidRecord(Exception):
    """Raised by `parse` for a record senders discard; the message says why."""


def host(domain: str) -> str:
    return f"_smtp._tls.{domain}"


def our_uri(domain_name: str, bounce_domain: str | None) -> str:
    """Where the guidance sends a domain's reports: the MX that reads them."""
    return f"mailto:{REPORTS_LOCAL_PART}@{bounce_domain or domain_name}"


def record(domain_name: str, bounce_domain: str | None) -> str:
    """The record the guidance gives."""
    return f"v=TLSRPTv1; rua={our_uri(domain_name, bounce_domain)}"


def parse(text: str) -> list[str]:
    """The `rua` URIs of a `v=TLSRPTv1` record; InvalidRecord when senders would discard it."""
    parts = [p.strip() for p in text.split(";")]
    if not parts or parts[0].replace(" ", "") != "v=TLSRPTv1":
        raise InvalidRecord("the record must begin with v=TLSRPTv1")
    rua: list[str] | None = None
    for part in parts[1:]:
        name, _, value = part.partition("=")
        if not part or name.strip() != "rua":
            continue  # an empty field, or one the RFC lets senders ignore
        if rua is not None:
            raise InvalidRecord("the record has rua twice")
        rua = [u.strip() for u in value.split(",") if u.strip()]
        for uri in rua:
            if not _URI.fullmatch(uri):
                raise InvalidRecord(f"rua {uri[:80]!r} is neither a mailto: nor an https: URI")
    if not rua:
        raise InvalidRecord("the record names no rua (where reports go)")
    return rua


def ours(records: list[str]) -> str | None:
    """The one TLSRPTv1 record among a name's TXT records; None when there is not exactly one."""
    found = [r for r in records if _VERSION.match(r)]
    return found[0] if len(found) == 1 else None


async def rua(rt: Runtime, domain: str) -> list[str]:
    """Where a recipient domain takes TLS reports; [] when it takes none (no usable record);
    dns.TemporaryDnsError when DNS cannot tell."""
    found = ours(await dns.txt(rt.resolver, host(domain)))
    if found is None:
        return []
    try:
        return parse(found)
    except InvalidRecord:
        return []


async def check(rt: Runtime, domain: str, *, bounce_domain: str | None = None) -> Finding:
    """Whether `domain` publishes a TLS reporting record, and whether its reports reach the
    service, as a finding whose facts are the record's `rua`."""
    name = host(domain)
    wanted = our_uri(domain, bounce_domain)
    try:
        records = await dns.txt(rt.resolver, name)
    except dns.TemporaryDnsError as exc:
        return Finding(PENDING, f"DNS could not answer: {exc}")
    published = [r for r in records if _VERSION.match(r)]
    if not published:
        return Finding(
            MISSING,
            f"no TLS reporting record at {name}: publish it to receive the reports other mail"
            " servers send about TLS to your MX (RFC 8460)",
        )
    if len(published) > 1:
        return Finding(
            INVALID,
            f"{name} publishes {len(published)} TLSRPTv1 records, so senders use none"
            " (RFC 8460 section 3): publish one",
        )
    try:
        uris = parse(published[0])
    except InvalidRecord as exc:
        return Finding(INVALID, f"senders discard the TLS reporting record at {name}: {exc}")
    if wanted.lower() not in (u.lower() for u in uris):
        suggested = f"v=TLSRPTv1; rua={','.join([*uris, wanted])}"
        return Finding(
            VERIFIED,
            f"reports go to {', '.join(uris)}; add {wanted} to see them in Postroom",
            suggested_value=suggested,
            facts={"rua": uris},
        )
    return Finding(VERIFIED, f"reports go to {', '.join(uris)}", facts={"rua": uris})
