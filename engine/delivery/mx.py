"""Where mail for a domain goes: its MX hosts in preference order, each with its addresses.

RFC 5321 section 5: no MX record means the domain's own A/AAAA records stand in for one; a
"null MX" (RFC 7505: one record, preference 0, host ".") means the domain accepts no mail,
which is a permanent failure. Host names are resolved through the service's resolver (not
the system's), so tests and operators control it in one place.
"""

from __future__ import annotations

from dataclasses import dataclass

import dns.asyncresolver

from engine import dns as lookups


class NoMailService(Exception):
    """Raised when a domain publishes a null MX or has no host to deliver to."""


@dataclass(frozen=True, slots=True)
class MxTarget:
    host: str
    addresses: tuple[str, ...]


async def targets(resolver: dns.asyncresolver.Resolver, domain: str) -> list[MxTarget]:
    """The hosts to try for `domain`, best first; TemporaryDnsError when DNS cannot answer."""
    records = await lookups.mx(resolver, domain)
    if any(host in ("", ".", "@") for _, host in records):
        raise NoMailService(f"{domain} accepts no mail (null MX)")
    hosts = [host for _, host in records] or [domain]
    found = []
    for host in dict.fromkeys(hosts):
        addresses = await lookups.addresses(resolver, host)
        if addresses:
            found.append(MxTarget(host, tuple(addresses)))
    if not found and not records:
        raise NoMailService(f"{domain} has neither MX nor address records")
    if not found:  # the MX hosts may yet appear in DNS: worth another try
        raise lookups.TemporaryDnsError(f"no MX host of {domain} has an address")
    return found
