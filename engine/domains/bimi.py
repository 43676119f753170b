"""BIMI: a domain's logo, the DNS record that points at it, and enabling it (Pro and above).

The logo is served publicly at `{public_url}/v1/bimi/{domain_id}/logo.svg`. Upload rules: a
`.svg` name, at most 100 KB of UTF-8, and an SVG document within the SVG Tiny PS profile
(`engine.svg_policy`: nothing that runs or reaches outside the document), since mail clients
and browsers render it. Enabling needs a verified domain, a logo, and a DMARC policy of
`quarantine` or `reject`, read from DNS.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine import plans
from engine.activity import Change, record
from engine.domains import dmarc, svg_policy
from engine.platform.errors import InvalidRequest, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import domains
from storage.domains import Domain
from storage.tx import Tx

MAX_LOGO_BYTES = 100 * 1024


@dataclass(frozen=True, slots=True)
class BimiStatus:
    domain: str
    domain_verified: bool
    bimi_svg_url: str | None
    bimi_vmc_url: str | None
    bimi_enabled: bool
    bimi_dns_record: str
    bimi_dns_host: str
    dmarc_upgrade_record: str | None


def logo_url(rt: Runtime, domain: Domain) -> str:
    return f"{rt.public_url}/v1/bimi/{domain.id}/logo.svg"


def dns_record(rt: Runtime, domain: Domain) -> str:
    return f"v=BIMI1; l={logo_url(rt, domain)};"


def dns_host(domain: Domain) -> str:
    return f"default._bimi.{domain.name}"


async def dmarc_policy(rt: Runtime, domain: Domain) -> str | None:
    """The domain's DMARC policy (`none`, `quarantine`, `reject`) as receivers read it
    (engine/domains/dmarc.py), or None when no valid record applies."""
    return await dmarc.applied_policy(rt, domain.name)


async def _domain_on_plan(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    plans.require(plans.plan(who.plan).bimi, "BIMI", who.plan)
    domain = await rt.db.read(domains.get, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    return domain


async def status(rt: Runtime, who: Principal, domain_id: str) -> BimiStatus:
    domain = await _domain_on_plan(rt, who, domain_id)
    policy = await dmarc_policy(rt, domain)
    upgrade = None
    if policy not in ("quarantine", "reject"):
        upgrade = f"v=DMARC1; p=quarantine; rua=mailto:dmarc-reports@{domain.name};"
    return BimiStatus(
        domain=domain.name,
        domain_verified=domain.status == "verified",
        bimi_svg_url=logo_url(rt, domain) if domain.bimi_svg else None,
        bimi_vmc_url=None,
        bimi_enabled=domain.bimi_enabled,
        bimi_dns_record=dns_record(rt, domain),
        bimi_dns_host=dns_host(domain),
        dmarc_upgrade_record=upgrade,
    )


def _refuse(code: str, detail: str) -> InvalidRequest:
    return InvalidRequest(detail, code=code)


def check_logo(filename: str, content: bytes) -> str:
    """The logo as text; InvalidRequest (400) when it breaks a rule."""
    if not filename.lower().endswith(".svg"):
        raise _refuse("not_svg", "the logo's file name must end in .svg")
    if len(content) > MAX_LOGO_BYTES:
        raise _refuse("logo_too_large", "the logo must be at most 100 KB")
    return svg_policy.check(content)


def _store_logo(tx: Tx, who: Principal, domain: Domain, svg: str, now: datetime) -> None:
    domains.set_bimi_logo(tx, domain.id, svg)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("bimi.logo_uploaded", domain.name, domain.id, {"size": len(svg.encode())}),
        now,
    )


async def upload_logo(
    rt: Runtime, who: Principal, domain_id: str, filename: str, content: bytes
) -> Domain:
    domain = await _domain_on_plan(rt, who, domain_id)
    svg = check_logo(filename, content)
    await rt.db.write(_store_logo, who, domain, svg, rt.clock.now())
    return domain


def _enable(tx: Tx, who: Principal, domain: Domain, now: datetime) -> None:
    domains.enable_bimi(tx, domain.id)
    record(
        tx, who.workspace_id, who.user_email, Change("bimi.enabled", domain.name, domain.id), now
    )


async def enable(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    """Enable BIMI; InvalidRequest (400) naming the missing prerequisite."""
    domain = await _domain_on_plan(rt, who, domain_id)
    if domain.status != "verified":
        raise _refuse("domain_not_verified", "verify the domain first")
    if not domain.bimi_svg:
        raise _refuse("no_logo", "upload a logo first")
    policy = await dmarc_policy(rt, domain)
    if policy not in ("quarantine", "reject"):
        raise _refuse(
            "dmarc_policy",
            f"the DMARC policy must be quarantine or reject, not {policy or 'absent'}",
        )
    await rt.db.write(_enable, who, domain, rt.clock.now())
    return domain


async def public_logo(rt: Runtime, domain_id: str) -> str:
    domain = await rt.db.read(domains.by_id, domain_id)
    if domain is None or not domain.bimi_svg:
        raise NotFound("no logo")
    return domain.bimi_svg
