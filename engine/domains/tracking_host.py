"""A sending domain's own tracking host: its open pixel and click links under a name of
the domain (`links.example.com`) rather than the service's shared host, so the links in its
mail point where its From does.

The owner sets the host (a name under the domain) through the domain API and publishes a
CNAME from it to the service's public host (an A/AAAA record when the public URL is an
address); the domain's checks look it up (record purpose `tracking`, guidance, not required
for sending). Only once it resolves to the service do links use it: until then, or when it
stops resolving at a later check, they stay on `POSTROOM_PUBLIC_URL`. The links keep the
public URL's scheme and port: the operator serves the host as it serves the public URL
(for https, a certificate for the name: README, Deliverability). Tokens are sealed
and name their email, so a request on any host the service answers is judged the same.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

import dns.asyncresolver

from engine.addresses import normalize_domain
from engine.platform import dns as lookups
from engine.platform.errors import Unprocessable
from storage.domains import Domain

PURPOSE = "tracking"
VERIFIED = "verified"


def _public_host(public_url: str) -> str:
    return (urlsplit(public_url).hostname or "").lower()


def _address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        return None


def _target(public_url: str) -> tuple[str, str]:
    host = _public_host(public_url)
    address = _address(host)
    if address is None:
        return "CNAME", host
    return ("A" if address.version == 4 else "AAAA"), host


def record(host: str, public_url: str) -> tuple[str, str, str]:
    """The record (type, name, value) a tracking host publishes: a CNAME to the service's
    public host, or an A/AAAA record when the public URL names an address."""
    kind, value = _target(public_url)
    return kind, host, value


async def points_here(resolver: dns.asyncresolver.Resolver, host: str, public_url: str) -> bool:
    """Whether `host` resolves to the service (TemporaryDnsError when DNS cannot say)."""
    kind, value = _target(public_url)
    if kind == "CNAME":
        return await lookups.cname(resolver, host) == value
    return value in await lookups.addresses(resolver, host)


def checked(host: str, domain_name: str) -> str:
    """`host` in canonical form; Unprocessable when it is no name under `domain_name`."""
    why = f"must be a host name under {domain_name} (e.g. links.{domain_name})"
    try:
        canonical = normalize_domain(host)
    except Unprocessable:
        canonical = ""
    if not canonical.endswith("." + domain_name):
        message = f"tracking_host {why}"
        raise Unprocessable(message, errors=[{"loc": ["body", "tracking_host"], "msg": message}])
    return canonical


def link_base(public_url: str, domain: Domain) -> str:
    """Where the domain's tracking links point: its tracking host once verified, else the
    service's public URL."""
    if domain.tracking_host is None or domain.record_status.get(PURPOSE) != VERIFIED:
        return public_url
    parts = urlsplit(public_url)
    port = f":{parts.port}" if parts.port is not None else ""
    return f"{parts.scheme}://{domain.tracking_host}{port}"
