"""Sending domains: creation with a DKIM key, the DNS records to publish, verification.

A domain is verified when its DKIM TXT record resolves and publishes the domain's key: that
is the only `required` record. A domain that signs with Ed25519 too (RFC 8463) publishes a
second DKIM record, not required: verification rests on the RSA one, which every receiver
can check. SPF, DMARC, TLS reporting, MX and a tracking host's record
(engine/domains/tracking_host.py) are guidance whose status is reported: SPF evaluated for the service's sending addresses
(engine/domains/spf.py), DMARC parsed (engine/domains/dmarc.py), the TLS reporting record read
(engine/domains/tls_rpt.py), each with why and what to publish (engine/domains/findings.py). A
domain whose DKIM record is still absent stays `pending`; one whose record publishes another
key is `failed`. Only one workspace at a time may have a given name verified.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import trio

from engine import plans
from engine.activity import Change, record
from engine.addresses import normalize_domain
from engine.domains import bounce_domain, dkim_keys, dmarc, spf, tls_rpt, tracking_host
from engine.domains.findings import Finding
from engine.mail.header_fields import TAGS_HEADER, custom_header_problems
from engine.platform import dns
from engine.platform.errors import Conflict, Forbidden, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import domains, sandbox
from storage.codec import new_id
from storage.domains import Domain
from storage.tx import Tx

PENDING, VERIFIED, MISSING, FAILED = "pending", "verified", "missing", "failed"
# Written into a marked domain's record statuses (and so its verification's log entry).
MARKED = "marked verified by the sandbox, without DNS"
SYSTEM_ACTOR = "postroom"  # the actor of a mark dropped by someone else's DNS proof


@dataclass(frozen=True, slots=True)
class DnsRecord:
    type: str
    host: str
    value: str
    purpose: str
    required: bool
    status: str
    detail: str | None = None  # why the status, from the last check
    suggested_value: str | None = None  # the record to publish in place of the one there


def dns_records(domain: Domain, smtp_host: str, spf_value: str, public_url: str) -> list[DnsRecord]:
    """The records the owner publishes, each with its status and what the last check found;
    `spf_value`: the SPF record to recommend (engine/domains/spf.py `recommended`); the
    tracking host's record needs the service's `public_url`."""
    return [_with_findings(domain, r) for r in _records(domain, smtp_host, spf_value, public_url)]


def _with_findings(domain: Domain, entry: DnsRecord) -> DnsRecord:
    key = "dkim_ed25519" if entry.purpose == "dkim" and not entry.required else entry.purpose
    found = domain.record_findings.get(key, {})
    return replace(entry, detail=found.get("detail"), suggested_value=found.get("suggested_value"))


def _records(domain: Domain, smtp_host: str, spf_value: str, public_url: str) -> list[DnsRecord]:
    status = domain.record_status
    return [
        DnsRecord(
            "TXT",
            f"{domain.dkim_selector}._domainkey.{domain.name}",
            dkim_keys.txt_value(domain.dkim_public_key),
            "dkim",
            True,
            status.get("dkim", PENDING),
        ),
        DnsRecord(
            "TXT",
            domain.name,
            spf_value or f"v=spf1 a:{smtp_host} ~all",
            "spf",
            False,
            status.get("spf", PENDING),
        ),
        DnsRecord(
            "TXT",
            f"_dmarc.{domain.name}",
            # Aggregate reports to the MX that reads them (engine/forwarding/dmarc_reports.py):
            # the bounce domain's MX points at the service even when the domain's does not.
            f"v=DMARC1; p=none; rua=mailto:{dmarc.REPORTS_LOCAL_PART}@"
            f"{domain.bounce_domain or domain.name};",
            "dmarc",
            False,
            status.get("dmarc", PENDING),
        ),
        DnsRecord(
            "TXT",
            # TLS reports about the domain's MX to the MX that reads them, as DMARC's go.
            tls_rpt.host(domain.name),
            tls_rpt.record(domain.name, domain.bounce_domain),
            tls_rpt.PURPOSE,
            False,
            status.get(tls_rpt.PURPOSE, PENDING),
        ),
        DnsRecord("MX", domain.name, f"10 {smtp_host}", "mx", False, status.get("mx", PENDING)),
        *(
            [
                DnsRecord(
                    "TXT",
                    f"{domain.ed25519_selector}._domainkey.{domain.name}",
                    dkim_keys.txt_value(domain.ed25519_public_key, "ed25519"),
                    "dkim",
                    False,
                    status.get("dkim_ed25519", PENDING),
                )
            ]
            if domain.ed25519_selector and domain.ed25519_public_key
            else []
        ),
        *(
            DnsRecord(r.type, r.host, r.value, bounce_domain.PURPOSE, False, r.status)
            for r in bounce_domain.records(domain, smtp_host)
        ),
        *(
            [
                DnsRecord(
                    *tracking_host.record(domain.tracking_host, public_url),
                    tracking_host.PURPOSE,
                    False,
                    status.get(tracking_host.PURPOSE, PENDING),
                )
            ]
            if domain.tracking_host
            else []
        ),
    ]


def _insert(tx: Tx, who: Principal, domain: Domain) -> Domain:
    if domains.by_name(tx, who.workspace_id, domain.name) is not None:
        raise Conflict(
            f"{domain.name} is already registered in this workspace", code="domain_exists"
        )
    plans.check_workspace_room(
        tx, who.workspace_id, plans.plan(who.plan).domains, domains.count, "domains", who.plan
    )
    domains.insert(tx, domain)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("domain.created", domain.name, domain.id),
        domain.created_at,
    )
    return domain


async def create(rt: Runtime, who: Principal, name: str) -> Domain:
    """Register a domain and generate its DKIM key; PlanLimit past the plan's domains."""
    canonical = normalize_domain(name)
    key = await dkim_keys.generate()
    domain = Domain(
        id=new_id(),
        workspace_id=who.workspace_id,
        name=canonical,
        status=PENDING,
        dkim_selector=key.selector,
        dkim_private_key=key.private_pem,
        dkim_public_key=key.public_b64,
        record_status={},
        open_tracking=False,
        click_tracking=False,
        created_at=rt.clock.now(),
        verified_at=None,
    )
    return await rt.db.write(_insert, who, domain)


async def get(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    domain = await rt.db.read(domains.get, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    return domain


async def list_all(rt: Runtime, who: Principal) -> list[Domain]:
    return await rt.db.read(domains.list_all, who.workspace_id)


def _update_tracking(
    tx: Tx,
    who: Principal,
    domain_id: str,
    open_tracking: bool | None,
    click_tracking: bool | None,
    now: datetime,
) -> Domain:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    opened = domain.open_tracking if open_tracking is None else open_tracking
    clicked = domain.click_tracking if click_tracking is None else click_tracking
    domains.set_tracking(tx, domain.id, opened, clicked)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change(
            "domain.updated",
            domain.name,
            domain.id,
            {
                "open_tracking": opened,
                "click_tracking": clicked,
                "ed25519_signing": domain.ed25519_signing,
                "tags_header": domain.tags_header,
                "tracking_host": domain.tracking_host,
            },
        ),
        now,
    )
    updated = domains.get(tx, who.workspace_id, domain_id)
    assert updated is not None
    return updated


@dataclass(frozen=True, slots=True)
class MailOptions:
    """How a domain's mail is signed and labelled; None leaves an option as it is."""

    ed25519_signing: bool | None = None
    tags_header: str | None = None
    set_tags_header: bool = False  # whether `tags_header` was given (None then clears it)
    # The domain's own host for its tracking links (engine/domains/tracking_host.py).
    tracking_host: str | None = None
    set_tracking_host: bool = False  # whether `tracking_host` was given (None clears it)


def tags_header_problem(name: str) -> str | None:
    """Why a header name cannot carry a domain's tags, or None."""
    if len(name) > 64:
        return "must be at most 64 characters"
    if name != TAGS_HEADER and custom_header_problems([(name, "tags")]):
        return "must be a header name (printable ASCII, no spaces or colons) Postroom does not set"
    return None


def _update_mail_options(
    tx: Tx, who: Principal, domain_id: str, options: MailOptions, key: dkim_keys.DkimKey
) -> None:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    signing = domain.ed25519_signing if options.ed25519_signing is None else options.ed25519_signing
    if signing and domain.ed25519_private_key is None:
        domains.set_ed25519_key(tx, domain.id, key.selector, key.private_pem, key.public_b64)
    tags = options.tags_header if options.set_tags_header else domain.tags_header
    domains.set_mail_options(tx, domain.id, signing, tags)
    if options.set_tracking_host:
        host = options.tracking_host
        host = None if host is None else tracking_host.checked(host, domain.name)
        if host != domain.tracking_host:  # a new host is unchecked until the next check
            statuses = dict(domain.record_status)
            statuses.pop(tracking_host.PURPOSE, None)
            domains.set_tracking_host(tx, domain.id, host, statuses)


async def update(
    rt: Runtime,
    who: Principal,
    domain_id: str,
    open_tracking: bool | None,
    click_tracking: bool | None,
    options: MailOptions | None = None,
) -> Domain:
    """Change the domain's tracking settings and mail options (None leaves a setting as it
    is). Turning Ed25519 signing on the first time gives the domain its Ed25519 key, whose
    record then appears among its DNS records. Unprocessable for a tags header name that
    cannot be one."""
    if options is not None and options.tags_header is not None:
        problem = tags_header_problem(options.tags_header)
        if problem is not None:
            message = f"tags_header {problem}"
            raise Unprocessable(message, errors=[{"loc": ["body", "tags_header"], "msg": message}])

    def change(tx: Tx, now: datetime) -> Domain:
        if options is not None:
            _update_mail_options(tx, who, domain_id, options, dkim_keys.generate_ed25519())
        return _update_tracking(tx, who, domain_id, open_tracking, click_tracking, now)

    return await rt.db.write(change, rt.clock.now())


def _delete(tx: Tx, who: Principal, domain_id: str, now: datetime) -> None:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    domains.delete(tx, domain.id)
    record(
        tx, who.workspace_id, who.user_email, Change("domain.deleted", domain.name, domain.id), now
    )


async def delete(rt: Runtime, who: Principal, domain_id: str) -> None:
    """Remove a domain and its senders."""
    await rt.db.write(_delete, who, domain_id, rt.clock.now())


async def check_records(rt: Runtime, domain: Domain) -> tuple[dict[str, str], dict[str, Any]]:
    """Look every record up at once: a status per purpose (a DNS failure keeps `pending`), and
    what was found beside it for the records that say more (findings.py)."""
    results: dict[str, str] = {}
    findings: dict[str, Any] = {}

    async def evaluate(purpose: str, judge: Callable[[Runtime, str], Awaitable[Finding]]) -> None:
        finding = await judge(rt, domain.name)
        results[purpose] = finding.status
        findings[purpose] = finding.stored()

    async def check(purpose: str, lookup: Callable[[], Awaitable[bool]]) -> None:
        try:
            results[purpose] = VERIFIED if await lookup() else MISSING
        except dns.TemporaryDnsError:
            results[purpose] = PENDING

    async def dkim() -> bool:
        published = [
            dkim_keys.published_key(value)
            for value in await dns.txt(
                rt.resolver, f"{domain.dkim_selector}._domainkey.{domain.name}"
            )
        ]
        if domain.dkim_public_key in published:
            return True
        if any(published):
            results["dkim_mismatch"] = "yes"
        return False

    async def mx() -> bool:
        hosts = [host for _, host in await dns.mx(rt.resolver, domain.name)]
        if hosts and rt.smtp_host.lower() not in hosts:
            detail = (
                f"mail for {domain.name} goes to {', '.join(hosts)}: keep that unless Postroom "
                "is to receive it (forwarding rules need the MX); sending does not"
            )
            findings["mx"] = Finding(MISSING, detail).stored()
        return rt.smtp_host.lower() in hosts

    async def tracking() -> bool:
        assert domain.tracking_host is not None
        return await tracking_host.points_here(rt.resolver, domain.tracking_host, rt.public_url)

    async def dkim_ed25519() -> bool:
        name = f"{domain.ed25519_selector}._domainkey.{domain.name}"
        published = [dkim_keys.published_key(value) for value in await dns.txt(rt.resolver, name)]
        return domain.ed25519_public_key in published

    lookups: list[tuple[str, Callable[[], Awaitable[bool]]]] = [
        ("dkim", dkim),
        ("mx", mx),
    ]
    if domain.ed25519_selector:
        lookups.append(("dkim_ed25519", dkim_ed25519))
    lookups.extend(bounce_domain.lookups(rt, domain))
    if domain.tracking_host:
        lookups.append((tracking_host.PURPOSE, tracking))
    async with trio.open_nursery() as nursery:
        for purpose, lookup in lookups:
            nursery.start_soon(check, purpose, lookup)
        nursery.start_soon(evaluate, "spf", spf.check)
        nursery.start_soon(evaluate, "dmarc", dmarc.check)
        reports = functools.partial(tls_rpt.check, bounce_domain=domain.bounce_domain)
        nursery.start_soon(evaluate, tls_rpt.PURPOSE, reports)
    return results, findings


def record_verification(
    tx: Tx,
    actor: str,
    domain: Domain,
    statuses: dict[str, str],
    now: datetime,
    log_every_check: bool,
    *,
    marked: bool = False,
    findings: dict[str, Any] | None = None,
) -> Domain:
    """Record what a check found (`statuses` per record purpose, `findings` beside them)
    under the one rule; `marked`: the sandbox's mark instead of a DNS lookup."""
    current = domains.get(tx, domain.workspace_id, domain.id)
    if current is None:
        raise NotFound("domain not found")
    mismatch = statuses.pop("dkim_mismatch", None) is not None
    if current.tracking_host != domain.tracking_host:  # changed while DNS was asked
        statuses.pop(tracking_host.PURPOSE, None)
    dkim = statuses["dkim"]
    if current.sandbox_verified and not marked and dkim != VERIFIED:
        return current  # a DNS check that proves nothing leaves a sandbox mark standing
    if dkim == VERIFIED:
        holders = domains.verified_elsewhere(tx, current.workspace_id, current.name)
        # A mark yields to any holder; a DNS proof only to another DNS proof.
        if any(marked or not holder.sandbox_verified for holder in holders):
            raise Conflict(
                f"{current.name} is verified by another workspace; transfer it instead",
                code="domain_taken",
            )
        for holder in holders:
            drop_mark(tx, holder, "verified in DNS by its owner elsewhere", SYSTEM_ACTOR, now)
        status = VERIFIED
    elif dkim == MISSING and (mismatch or current.status == VERIFIED):
        status = FAILED
    else:  # still absent, or DNS could not answer: nothing new was learned
        status = current.status
    verified_at = (current.verified_at or now) if status == VERIFIED else None
    domains.record_check(tx, current.id, status, statuses, now, verified_at, marked, findings)
    if log_every_check or status != current.status:
        action = "domain.verified" if status == VERIFIED else "domain.verification_failed"
        meta = {"status": status, "records": statuses}
        record(tx, current.workspace_id, actor, Change(action, current.name, current.id, meta), now)
    updated = domains.get(tx, current.workspace_id, domain.id)
    assert updated is not None
    return updated


def mark(tx: Tx, actor: str, workspace_id: str, domain_id: str, now: datetime) -> Domain:
    """The sandbox's mark: verified without DNS, in a sandboxed workspace only (Forbidden
    `sandbox_only` otherwise; Conflict `domain_taken` when another workspace holds the name).
    A domain already proven in DNS keeps that proof."""
    if not sandbox.is_sandboxed(tx, workspace_id, lock=True):
        raise Forbidden("this workspace is not in sandbox mode", code="sandbox_only")
    domain = domains.get(tx, workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    if domain.status == VERIFIED and not domain.sandbox_verified:
        return domain
    statuses = {"dkim": VERIFIED, "sandbox": MARKED}
    return record_verification(tx, actor, domain, statuses, now, True, marked=True)


def drop_mark(tx: Tx, domain: Domain, reason: str, actor: str, now: datetime) -> bool:
    """Set a sandbox-marked domain back to pending, telling its workspace why (`reason`);
    False when it bore no mark."""
    if not sandbox.drop_mark(tx, domain.id, now):
        return False
    meta = {"status": PENDING, "reason": reason}
    change = Change("domain.pending", domain.name, domain.id, meta)
    record(tx, domain.workspace_id, actor, change, now)
    return True


async def check(rt: Runtime, actor: str, domain: Domain, *, log_every_check: bool) -> Domain:
    """Look the domain's records up in DNS and record what was found.

    A person's check is always logged; the background checker logs only a change of status.
    """
    statuses, findings = await check_records(rt, domain)
    return await rt.db.write(
        functools.partial(record_verification, findings=findings),
        actor,
        domain,
        statuses,
        rt.clock.now(),
        log_every_check,
    )


async def verify(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    """Check the domain's records now, on the principal's request; in a sandboxed workspace,
    mark it verified as the sandbox does (what POSTROOM_SANDBOX=on promises)."""
    domain = await get(rt, who, domain_id)
    if await rt.db.read(sandbox.is_sandboxed, who.workspace_id):
        return await rt.db.write(mark, who.user_email, who.workspace_id, domain.id, rt.clock.now())
    return await check(rt, who.user_email, domain, log_every_check=True)
