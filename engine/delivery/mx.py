"""Where mail for a domain goes: its MX hosts in preference order, each with its addresses.

RFC 5321 section 5: no MX record means the domain's own A/AAAA records stand in for one; a
"null MX" (RFC 7505: one record, preference 0, host ".") means the domain accepts no mail,
which is a permanent failure. Host names are resolved through the service's resolver (not
the system's), so tests and operators control it in one place.

A tenant picks the recipient domain, hence its MX hosts: unless private targets are allowed
(POSTROOM_ALLOW_PRIVATE_TARGETS), addresses the private-network rule refuses
(engine/platform/private_networks.py) are left out, and a domain whose hosts have no other address is
`PrivateTargets`: nothing in the operator's own network is ever connected to for a tenant.
"""

from __future__ import annotations

from dataclasses import dataclass

import dns.asyncresolver

from engine.platform import dns as lookups
from engine.platform.private_networks import public_only


class NoMailService(Exception):
    """Raised when a domain publishes a null MX or has no host to deliver to."""


class PrivateTargets(Exception):
    """Raised when every address of a domain's mail hosts is one the private-network rule
    refuses (and private targets are not allowed)."""


@dataclass(frozen=True, slots=True)
class MxTarget:
    host: str
    addresses: tuple[str, ...]
    # The MX answer naming the host was authenticated (DNSSEC): DANE may apply to it
    # (engine/delivery/dane.py). For a domain without MX records (the domain is the host):
    # the denial of its MX records and its own address answers were (RFC 7672 2.2.2).
    secure: bool = False


async def targets(
    resolver: dns.asyncresolver.Resolver, domain: str, *, allow_private: bool
) -> list[MxTarget]:
    """The hosts to try for `domain`, best first; TemporaryDnsError when DNS cannot answer."""
    records, secure = await lookups.mx_secured(resolver, domain)
    if any(host in ("", ".", "@") for _, host in records):
        raise NoMailService(f"{domain} accepts no mail (null MX)")
    hosts = [host for _, host in records] or [domain]
    found = []
    refused = 0
    for host in dict.fromkeys(hosts):
        addresses, direct = await lookups.addresses_secured(resolver, host)
        allowed = addresses if allow_private else public_only(addresses)
        refused += len(addresses) - len(allowed)
        if allowed:
            # Without MX records the domain is its own TLSA base domain when its address
            # records are authenticated and not reached through a CNAME (RFC 7672 2.2.2;
            # a CNAME's target as base domain is not followed).
            covered = secure if records else secure and direct
            found.append(MxTarget(host, tuple(allowed), covered))
    if not found and refused:
        raise PrivateTargets(
            f"the mail hosts of {domain} resolve only to private or reserved addresses,"
            " which the service does not connect to"
        )
    if not found and not records:
        raise NoMailService(f"{domain} has neither MX nor address records")
    if not found:  # the MX hosts may yet appear in DNS: worth another try
        raise lookups.TemporaryDnsError(f"no MX host of {domain} has an address")
    return found
