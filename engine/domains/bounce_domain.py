"""A sending domain's bounce domain: where its envelope sender lives, so bounces come back.

The envelope sender is `bounces+<email id>@<domain>` (engine/mail/addresses.py). When the
domain's own mail is hosted elsewhere (Google Workspace, Microsoft 365), DSNs and complaints
sent to it never reach Postroom. A bounce domain (e.g. `bounces.example.com`) is a subdomain
of the sending domain whose MX points at the service and whose SPF record authorises it; once
both records check out it is the envelope sender's domain. Being a subdomain keeps SPF
aligned with the From domain under DMARC's relaxed rule (same organisational domain); DKIM
still signs as the sending domain. Until both records check out, and whenever a later check
finds one gone, mail goes from the sending domain itself, as before.

The two records are guidance (`required` false: they never decide the domain's own status);
their statuses are kept among the domain's record statuses under keys that name the bounce
domain, so a check of a bounce domain since replaced counts for nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from engine.activity import Change, record
from engine.addresses import normalize_domain
from engine.platform import dns
from engine.platform.errors import NotFound, Unprocessable
from storage import domains
from storage.domains import Domain
from storage.tx import Tx

if TYPE_CHECKING:
    from engine.platform.runtime import Principal, Runtime

PURPOSE = "bounce"  # the `purpose` of its records in a domain's DNS records
VERIFIED, PENDING = "verified", "pending"


def mx_key(bounce_domain: str) -> str:
    return f"bounce_mx:{bounce_domain}"


def spf_key(bounce_domain: str) -> str:
    return f"bounce_spf:{bounce_domain}"


@dataclass(frozen=True, slots=True)
class BounceRecord:
    """One record to publish for the bounce domain, with its status from the last check."""

    type: str
    host: str
    value: str
    status: str


def spf_value(smtp_host: str) -> str:
    return f"v=spf1 a:{smtp_host} ~all"


def records(domain: Domain, smtp_host: str) -> list[BounceRecord]:
    """The bounce domain's MX and SPF records (none when the domain has no bounce domain)."""
    name = domain.bounce_domain
    if name is None:
        return []
    status = domain.record_status
    return [
        BounceRecord("MX", name, f"10 {smtp_host}", status.get(mx_key(name), PENDING)),
        BounceRecord("TXT", name, spf_value(smtp_host), status.get(spf_key(name), PENDING)),
    ]


def in_use(domain: Domain) -> bool:
    """Whether the domain's mail goes out with its bounce domain as the envelope sender's:
    it has one, and its MX and SPF records were found at the last check."""
    name = domain.bounce_domain
    if name is None:
        return False
    status = domain.record_status
    return status.get(mx_key(name)) == VERIFIED and status.get(spf_key(name)) == VERIFIED


def envelope_domain(domain: Domain) -> str:
    """The domain of the envelope sender (Return-Path) of the domain's mail."""
    if in_use(domain) and domain.bounce_domain is not None:
        return domain.bounce_domain
    return domain.name


def lookups(rt: Runtime, domain: Domain) -> list[tuple[str, Callable[[], Awaitable[bool]]]]:
    """The checks of the bounce domain's records, as (status key, lookup) pairs for the
    domain's check (engine/domains/registry.py), which runs them with its own."""
    name = domain.bounce_domain
    if name is None:
        return []
    host = rt.smtp_host.lower()

    async def mx() -> bool:
        return any(found == host for _, found in await dns.mx(rt.resolver, name))

    async def spf() -> bool:
        # The same test as the sending domain's SPF guidance: a record naming the service.
        return any(
            r.lower().startswith("v=spf1") and host in r.lower()
            for r in await dns.txt(rt.resolver, name)
        )

    return [(mx_key(name), mx), (spf_key(name), spf)]


def problem(name: str, domain_name: str) -> str | None:
    """Why `name` (canonical) cannot be the bounce domain of `domain_name`, or None."""
    if not name.endswith("." + domain_name):
        return f"must be a subdomain of {domain_name} (e.g. bounces.{domain_name})"
    return None


def _refuse(message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", "bounce_domain"], "msg": message}])


def canonical(value: str, domain: Domain) -> str:
    """The bounce domain `value` names for `domain`, canonical; Unprocessable if it cannot
    be one (not a domain name, not a subdomain of the sending domain)."""
    try:
        name = normalize_domain(value)
    except Unprocessable:
        raise _refuse(f"bounce_domain {value!r} is not a domain name") from None
    found = problem(name, domain.name)
    if found is not None:
        raise _refuse(f"bounce_domain {found}")
    return name


def _set(tx: Tx, who: Principal, domain_id: str, value: str | None, now: datetime) -> None:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    name = None if value is None else canonical(value, domain)
    if name == domain.bounce_domain:
        return
    # The replaced bounce domain's statuses go: they say nothing about the new one.
    kept = {k: v for k, v in domain.record_status.items() if not k.startswith("bounce_")}
    domains.set_bounce_domain(tx, domain.id, name, kept, now)
    change = Change("domain.updated", domain.name, domain.id, {"bounce_domain": name})
    record(tx, who.workspace_id, who.user_email, change, now)


async def set_bounce_domain(rt: Runtime, who: Principal, domain_id: str, value: str | None) -> None:
    """Give the domain a bounce domain (None: none, mail goes from the domain itself). Its
    records are pending until the domain is checked again: on verify, or by the domain
    checker for `checker.GIVE_UP_AFTER` after this."""
    await rt.db.write(_set, who, domain_id, value, rt.clock.now())


async def awaiting_check(rt: Runtime, since: datetime) -> list[Domain]:
    """Verified domains given a bounce domain after `since` that is not in use yet: the
    domain checker (engine/domains/checker.py) checks them as it checks pending domains."""
    found = await rt.db.read(domains.verified_with_bounce_domain_since, since)
    return [domain for domain in found if not in_use(domain)]


async def check_name(rt: Runtime, who: Principal, domain_id: str, value: str) -> None:
    """Unprocessable unless `value` can be the domain's bounce domain (NotFound: no such
    domain); changes nothing, so a request can be refused before any of it is applied."""
    domain = await rt.db.read(domains.get, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    canonical(value, domain)
