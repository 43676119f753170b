"""DNS lookups through dnspython's async resolver (Trio backend).

The resolver answers from the servers in `POSTROOM_DNS_SERVERS` (tests point it at their own
authoritative server on loopback) or from the system's configuration. Lookups tell "the name
has no such record" (an empty answer) apart from "DNS could not answer now"
(`TemporaryDnsError`), because only the first is a fact worth acting on.

With POSTROOM_DNSSEC on, every query asks for DNSSEC (the DO and AD bits) and the answers'
AD bit is trusted: the configured resolvers are the operator's validating ones, as Postfix's
`smtp_dns_support_level = dnssec`. Only the MX and TLSA lookups of DANE read it (`secure`).
"""

from __future__ import annotations

import dns.asyncresolver
import dns.exception
import dns.flags
import dns.nameserver
import dns.rdata
import dns.resolver
import dns.reversename

LOOKUP_LIFETIME = 5.0


class TemporaryDnsError(Exception):
    """Raised when a lookup fails for a reason that may pass (timeout, SERVFAIL)."""


def make_resolver(
    servers: list[tuple[str, int]] | None, *, dnssec: bool = False
) -> dns.asyncresolver.Resolver:
    """A resolver for the given `(host, port)` servers, or the system's when None; with
    `dnssec`, one that asks for validated answers (RFC 6840 5.7: the AD bit in the query)."""
    if servers is None:
        resolver = dns.asyncresolver.Resolver()
    else:
        resolver = dns.asyncresolver.Resolver(configure=False)
        resolver.nameservers = [dns.nameserver.Do53Nameserver(host, port) for host, port in servers]
    resolver.lifetime = LOOKUP_LIFETIME
    if dnssec:
        resolver.use_edns(0, dns.flags.DO, 1232)
        resolver.flags = dns.flags.RD | dns.flags.AD
    return resolver


def secure(answer: dns.resolver.Answer) -> bool:
    """Whether the resolver marked the answer authenticated (AD): trusted only with
    POSTROOM_DNSSEC on, whose resolvers are validating ones."""
    return bool(answer.response.flags & dns.flags.AD)


async def _answer(
    resolver: dns.asyncresolver.Resolver, name: str, rdtype: str
) -> dns.resolver.Answer | None:
    return (await _answer_secured(resolver, name, rdtype))[0]


async def _answer_secured(
    resolver: dns.asyncresolver.Resolver, name: str, rdtype: str
) -> tuple[dns.resolver.Answer | None, bool]:
    """The answer (None: no such records) and whether it, or the denial that there are
    any at an existing name, was authenticated."""
    try:
        answer = await resolver.resolve(name, rdtype, search=False)
    except dns.resolver.NoAnswer as exc:
        denial = exc.kwargs.get("response")
        return None, denial is not None and bool(denial.flags & dns.flags.AD)
    except dns.resolver.NXDOMAIN:
        return None, False
    except (dns.resolver.NoNameservers, dns.exception.Timeout, dns.resolver.LifetimeTimeout) as exc:
        raise TemporaryDnsError(f"{rdtype} lookup of {name} failed: {exc}") from exc
    return answer, secure(answer)


async def rdatas(
    resolver: dns.asyncresolver.Resolver, name: str, rdtype: str
) -> list[dns.rdata.Rdata]:
    """The records of one type at `name` (CNAMEs followed), as dnspython rdata; [] for none."""
    answer = await _answer(resolver, name, rdtype)
    return [] if answer is None else list(answer)


async def txt(resolver: dns.asyncresolver.Resolver, name: str) -> list[str]:
    """Every TXT record at `name`, each with its character-strings joined."""
    answer = await _answer(resolver, name, "TXT")
    if answer is None:
        return []
    return [b"".join(rdata.strings).decode("utf-8", "replace") for rdata in answer]


async def mx(resolver: dns.asyncresolver.Resolver, name: str) -> list[tuple[int, str]]:
    """The MX records at `name` as (preference, host without trailing dot), best first."""
    return (await mx_secured(resolver, name))[0]


async def mx_secured(
    resolver: dns.asyncresolver.Resolver, name: str
) -> tuple[list[tuple[int, str]], bool]:
    """As `mx`, and whether the answer was authenticated (`secure`), or for none whether the
    denial that the name has MX records was."""
    answer, authenticated = await _answer_secured(resolver, name, "MX")
    if answer is None:
        return [], authenticated
    records = [
        (int(rdata.preference), rdata.exchange.to_text(omit_final_dot=True).lower())
        for rdata in answer
    ]
    return sorted(records), secure(answer)


async def tlsa(
    resolver: dns.asyncresolver.Resolver, name: str
) -> tuple[list[tuple[int, int, int, bytes]], bool]:
    """The TLSA records at `name` as (usage, selector, matching type, data), and whether the
    answer was authenticated; ([], False) for none (RFC 7672 2.2: no DANE for the host)."""
    answer = await _answer(resolver, name, "TLSA")
    if answer is None:
        return [], False
    found = [
        (int(rdata.usage), int(rdata.selector), int(rdata.mtype), bytes(rdata.cert))
        for rdata in answer
    ]
    return found, secure(answer)


async def addresses(resolver: dns.asyncresolver.Resolver, name: str) -> list[str]:
    """The IPv4 then IPv6 addresses of a host name."""
    return (await addresses_secured(resolver, name))[0]


async def addresses_secured(
    resolver: dns.asyncresolver.Resolver, name: str
) -> tuple[list[str], bool]:
    """As `addresses`, and whether both answers (or denials) were authenticated and came
    from the name itself, not through a CNAME."""
    found: list[str] = []
    direct = True
    for rdtype in ("A", "AAAA"):
        answer, authenticated = await _answer_secured(resolver, name, rdtype)
        direct = direct and authenticated
        if answer is not None:
            direct = direct and answer.canonical_name == answer.qname
            found.extend(rdata.to_text() for rdata in answer)
    return found, direct


async def confirmed_name(resolver: dns.asyncresolver.Resolver, address: str) -> str | None:
    """The host name an address's PTR record gives, if that name resolves back to the
    address (forward-confirmed, as receivers check it); None otherwise or when DNS fails."""
    try:
        answer = await _answer(resolver, dns.reversename.from_address(address).to_text(), "PTR")
        if answer is None:
            return None
        name = answer[0].target.to_text(omit_final_dot=True).lower()
        return name if address in await addresses(resolver, name) else None
    except (TemporaryDnsError, dns.exception.DNSException, ValueError):
        return None


async def cname(resolver: dns.asyncresolver.Resolver, name: str) -> str | None:
    """The target of the CNAME record at `name` (lower case, no trailing dot), or None."""
    answer = await _answer(resolver, name, "CNAME")
    if answer is None:
        return None
    return str(answer[0].target.to_text(omit_final_dot=True)).lower()
