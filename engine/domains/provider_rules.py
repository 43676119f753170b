"""A sending domain's live compliance report (issue 31, section 3): each requirement Gmail,
Yahoo and Microsoft (Outlook.com) set for bulk senders, judged now, with what was found and
what to do, grouped per provider with the provider's overall status (its worst item).

- The requirements are a table (`REQUIREMENTS`): each names, per provider, the rule of that
  provider it answers (a provider that sets none is left out), and has one judge. Which
  provider asks what is data here, never an `if` in a judge.
- The facts are gathered first (`gather`): the domain's DNS records looked up again through
  the service's resolver, as a domain check does (engine/domains/registry.py), and the PTR
  of each sending address, all within DEADLINE (past it, the last stored check stands in and
  the report says so); its deliveries and complaints over the complaint guard's window, in
  one read. The judging (`evaluate`) is pure.
- SPF, DKIM, DMARC, the bounce domain and https unsubscribe links are the domain's
  bulk-sender rules (engine/domains/compliance.py), judged on the fresh lookup: one rule in
  one place; this module adds what they do not say (where DMARC reports go, TLS on delivery,
  reverse DNS, the complaint rate) and what to do.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

import trio
from dns import reversename

from engine.domains import compliance, dmarc, registry, spf
from engine.domains.registry import DnsRecord
from engine.platform import dns
from engine.platform.runtime import Principal, Runtime
from engine.platform.settings import COMPLAINT_WINDOW, PAUSE_RATE, STOP_RATE
from storage import complaint_rates
from storage import compliance as recent
from storage.complaint_rates import Counts
from storage.compliance import TlsShare
from storage.domains import Domain
from storage.tx import Tx

PASS, WARN, FAIL = "pass", "warn", "fail"
_WORST = (PASS, WARN, FAIL)  # a provider's status is the last of these any item has
DEADLINE = 10.0  # seconds for every DNS lookup of one report
TLS_PASS_SHARE = 0.95  # deliveries over TLS, below which the item warns


@dataclass(frozen=True, slots=True)
class Provider:
    key: str
    name: str
    rules: str  # the document its requirements come from
    url: str


PROVIDERS = (
    Provider(
        "gmail",
        "Gmail",
        "Google's email sender guidelines (bulk senders: 5,000 messages a day to Gmail)",
        "https://support.google.com/a/answer/81126",
    ),
    Provider(
        "yahoo",
        "Yahoo",
        "Yahoo's sender best practices (bulk senders)",
        "https://senders.yahooinc.com/best-practices/",
    ),
    Provider(
        "microsoft",
        "Microsoft (Outlook.com)",
        "Microsoft's requirements for high-volume senders (May 2025: 5,000 messages a day)",
        "https://techcommunity.microsoft.com/blog/microsoftdefenderforoffice365blog/"
        "strengthening-email-ecosystem-outlook%E2%80%99s-new-requirements-for-high%E2%80%90"
        "volume-senders/4399730",
    ),
)


@dataclass(frozen=True, slots=True)
class Ptr:
    """The reverse DNS of one sending address."""

    address: str
    name: str | None  # the name its PTR record gives
    confirmed: bool  # that name resolves back to the address (forward-confirmed)
    known: bool  # DNS answered


@dataclass(frozen=True, slots=True)
class Facts:
    """Everything the requirements are judged from."""

    domain: Domain  # its record statuses and findings as just looked up (or as last stored)
    live: bool  # DNS answered within DEADLINE
    verdicts: Mapping[str, compliance.Verdict]  # the bulk-sender rules, by rule
    records: Mapping[str, DnsRecord]  # the records to publish, by purpose (the first of each)
    ptrs: tuple[Ptr, ...] | None  # None: the sending addresses are unknown
    tls: TlsShare  # the domain's deliveries over the window
    complaints: Counts


@dataclass(frozen=True, slots=True)
class Judged:
    status: str
    evidence: str  # what was found
    action: str | None  # what to do; None when nothing is


@dataclass(frozen=True, slots=True)
class Cite:
    """A provider's rule a requirement answers."""

    rule: str
    required: bool  # False: the provider recommends it, and failing it is only a warning


def must(rule: str) -> Cite:
    return Cite(rule, True)


def should(rule: str) -> Cite:
    return Cite(rule, False)


@dataclass(frozen=True, slots=True)
class Requirement:
    key: str
    title: str
    judge: Callable[[Facts], Judged]
    cites: Mapping[str, Cite]  # provider key -> the rule of that provider it answers


@dataclass(frozen=True, slots=True)
class Item:
    requirement: str
    title: str
    rule: str  # the provider's rule it answers
    required: bool  # False: the provider recommends it (a failure is a warning)
    status: str
    evidence: str
    action: str | None


@dataclass(frozen=True, slots=True)
class ProviderReport:
    provider: str
    name: str
    rules: str
    url: str
    status: str  # its worst item
    items: list[Item]


@dataclass(frozen=True, slots=True)
class Report:
    domain_id: str
    domain: str
    checked_at: datetime
    live: bool  # DNS answered within DEADLINE; otherwise DNS items are from the last check
    status: str  # the worst provider's
    providers: list[ProviderReport]


# -- the judges ----------------------------------------------------------------------------

_FROM_VERDICT = {compliance.PASS: PASS, compliance.FAIL: FAIL}  # pending (unknown): warn


def _publish(record: DnsRecord) -> str:
    return f"publish the {record.type} record at {record.host}: {record.suggested_value or record.value}"


def _rule(facts: Facts, key: str, action: str, unknown: str | None = None) -> Judged:
    """The bulk-sender rule `key`'s verdict, with `action` when it fails; when it is not
    known yet (pending: a warning), `unknown`, by default to look again later."""
    verdict = facts.verdicts[key]
    status = _FROM_VERDICT.get(verdict.status, WARN)
    if status == PASS:
        return Judged(PASS, verdict.reason, None)
    if status == WARN:
        action = unknown or "check again later: DNS could not answer, or nothing was checked yet"
    return Judged(status, verdict.reason, action)


_NO_ADDRESSES = (
    "the operator sets POSTROOM_SENDING_ADDRESSES (or publishes an address for its host)"
)


def _spf(facts: Facts) -> Judged:
    # Not known while the service's own addresses are unknown: the operator's to say.
    unknown = _NO_ADDRESSES if facts.ptrs is None else None
    return _rule(facts, "spf", _publish(facts.records["spf"]), unknown)


def _dkim(facts: Facts) -> Judged:
    return _rule(facts, "dkim", _publish(facts.records["dkim"]))


def _dmarc(facts: Facts) -> Judged:
    judged = _rule(facts, "dmarc", _publish(facts.records["dmarc"]))
    policy = facts.verdicts["dmarc"]
    found = facts.domain.record_findings.get("dmarc", {}).get("facts") or {}
    if judged.status != PASS or policy.status != compliance.PASS or found.get("rua"):
        return judged
    guidance = facts.records["dmarc"]
    rua = ",".join(dmarc.parse(guidance.value, guidance.host).rua)
    return Judged(
        WARN,
        f"{judged.evidence}; the record names no rua, so no receiver reports what it sees",
        f"add rua={rua} to the record at {found.get('host', guidance.host)}: the service reads"
        f" the reports (GET /v1/domains/{facts.domain.id}/dmarc)",
    )


def _bounce_domain(facts: Facts) -> Judged:
    bounce = [r for p, r in facts.records.items() if p.startswith("bounce")]
    action = (
        "; ".join(_publish(r) for r in bounce)
        if bounce
        else f"set a bounce domain (PATCH /v1/domains/{facts.domain.id} with bounce_domain, "
        f"e.g. bounces.{facts.domain.name}) and publish its MX and SPF records"
    )
    return _rule(facts, "bounce_domain", action, action)  # pending: not published yet


def _unsubscribe(facts: Facts) -> Judged:
    return _rule(
        facts,
        "unsubscribe_https",
        "the operator sets POSTROOM_PUBLIC_URL to an https:// URL: unsubscribe links and their "
        "one-click POST (RFC 8058) are served under it",
    )


def _tls(facts: Facts) -> Judged:
    share = facts.tls
    days = COMPLAINT_WINDOW.days
    if not share.delivered:
        return Judged(
            WARN,
            f"no mail from {facts.domain.name} was delivered in the last {days} days: "
            "nothing shows yet whether it goes over TLS",
            "nothing to do until mail is delivered: the share is measured from deliveries",
        )
    part = share.encrypted / share.delivered
    evidence = (
        f"{share.encrypted} of {share.delivered} deliveries in the last {days} days went over "
        f"TLS ({part:.1%}), {share.verified} with the receiver's certificate verified"
    )
    if part >= TLS_PASS_SHARE:
        return Judged(PASS, evidence, None)
    return Judged(
        WARN,
        evidence,
        "the other deliveries went to servers that offered no STARTTLS or failed its handshake "
        "(their delivered events carry `tls`: null); Gmail requires TLS of all mail sent to it",
    )


def _ptr(facts: Facts) -> Judged:
    action = (
        "the operator has the network that owns each address publish a PTR record naming a "
        "host whose A or AAAA record gives the address back"
    )
    if facts.ptrs is None:
        return Judged(
            WARN,
            "the addresses the service sends from are unknown: POSTROOM_SENDING_ADDRESSES is "
            "not set and the service's host name gave no address in time",
            _NO_ADDRESSES,
        )
    found, status = [], PASS
    for ptr in facts.ptrs:
        if ptr.confirmed:
            found.append(f"{ptr.address} is {ptr.name}, which resolves back to it")
            continue
        if not ptr.known:
            found.append(f"the reverse DNS of {ptr.address} could not be looked up")
            status = max(status, WARN, key=_WORST.index)
        elif ptr.name is None:
            found.append(f"{ptr.address} has no PTR record")
            status = FAIL
        else:
            found.append(f"{ptr.address} is {ptr.name}, which does not resolve back to it")
            status = FAIL
    return Judged(status, "; ".join(found), None if status == PASS else action)


def _complaint_rate(facts: Facts) -> Judged:
    counts, days = facts.complaints, COMPLAINT_WINDOW.days
    if not counts.delivered:
        return Judged(
            PASS, f"no mail from {facts.domain.name} was delivered in the last {days} days", None
        )
    rate = counts.complained / counts.delivered
    evidence = (
        f"{counts.complained} complaints about {counts.delivered} recipients delivered in the "
        f"last {days} days: {rate:.2%}"
    )
    stopped = facts.domain.marketing_stopped_at
    if stopped is not None:
        evidence += (
            f"; the complaint-rate guard stopped its mail that offers unsubscribe at "
            f"{stopped.isoformat()}"
        )
    if counts.complained >= STOP_RATE * counts.delivered:
        status = FAIL
    elif counts.complained >= PAUSE_RATE * counts.delivered:
        status = WARN
    else:
        return Judged(PASS, evidence, None)
    return Judged(
        status,
        evidence,
        f"keep it under {PAUSE_RATE:.1%} and never reach {STOP_RATE:.1%}: send only to people "
        "who asked for the mail, make unsubscribing easy, and drop recipients who never open it",
    )


REQUIREMENTS: tuple[Requirement, ...] = (
    Requirement(
        "spf",
        "SPF authorises the service's sending addresses",
        _spf,
        {
            "gmail": must("Set up SPF and DKIM email authentication for your domain"),
            "yahoo": must("Authenticate your email: implement SPF and DKIM"),
            "microsoft": must("SPF must pass for the sending domain"),
        },
    ),
    Requirement(
        "dkim",
        "DKIM signs as the domain itself (aligned d=)",
        _dkim,
        {
            "gmail": must("Set up SPF and DKIM email authentication for your domain"),
            "yahoo": must("Authenticate your email: implement SPF and DKIM"),
            "microsoft": must("DKIM must pass to validate email integrity and authenticity"),
        },
    ),
    Requirement(
        "dmarc",
        "A DMARC policy is published, mail passes it aligned, and reports come back",
        _dmarc,
        {
            "gmail": must(
                "Set up DMARC email authentication (p=none at least); the From domain "
                "aligns with the SPF or the DKIM domain"
            ),
            "yahoo": must(
                "Publish a valid DMARC policy (p=none at least) and pass DMARC alignment"
            ),
            "microsoft": must("DMARC at least p=none, aligned with SPF or DKIM (ideally both)"),
        },
    ),
    Requirement(
        "bounce_domain",
        "A bounce domain brings bounces and complaints back, SPF aligned",
        _bounce_domain,
        {
            "gmail": should("The From domain aligns with the SPF domain or the DKIM domain"),
            "yahoo": should("Your sending domain aligns with SPF or DKIM"),
            "microsoft": should("Align with SPF or DKIM (ideally both); maintain list hygiene"),
        },
    ),
    Requirement(
        "unsubscribe_https",
        "One-click unsubscribe over https on bulk mail (RFC 8058)",
        _unsubscribe,
        {
            "gmail": must("Marketing and subscribed messages support one-click unsubscribe"),
            "yahoo": must("Easy unsubscribe: a one-click List-Unsubscribe-Post header (RFC 8058)"),
            "microsoft": should("Functional unsubscribe link"),
        },
    ),
    Requirement(
        "tls",
        "Mail is delivered over TLS",
        _tls,
        {"gmail": must("Use a TLS connection for transmitting email")},
    ),
    Requirement(
        "ptr",
        "Each sending address has forward-confirmed reverse DNS (the operator's)",
        _ptr,
        {
            "gmail": must(
                "Sending domains or IPs have valid forward and reverse DNS (PTR) records"
            ),
            "yahoo": must("Have valid forward and reverse DNS records for your sending IPs"),
        },
    ),
    Requirement(
        "complaint_rate",
        f"Complaints under {PAUSE_RATE:.1%} of delivered mail, never {STOP_RATE:.1%}",
        _complaint_rate,
        {
            "gmail": must(
                f"Keep spam rates below {PAUSE_RATE:.1%} and never reach {STOP_RATE:.1%}"
            ),
            "yahoo": must(f"Keep your spam complaint rate below {STOP_RATE:.1%}"),
        },
    ),
)


def _worst(statuses: list[str]) -> str:
    return max(statuses, key=_WORST.index, default=PASS)


def _item(requirement: Requirement, cite: Cite, judged: Judged) -> Item:
    # A recommendation not met is a warning, whatever the requirement's own judge says.
    status = WARN if judged.status == FAIL and not cite.required else judged.status
    return Item(
        requirement.key,
        requirement.title,
        cite.rule,
        cite.required,
        status,
        judged.evidence,
        judged.action,
    )


def evaluate(facts: Facts) -> list[ProviderReport]:
    """Each provider's requirements judged from `facts`, each requirement judged once."""
    judged = {r.key: r.judge(facts) for r in REQUIREMENTS}
    reports = []
    for provider in PROVIDERS:
        items = [
            _item(r, r.cites[provider.key], judged[r.key])
            for r in REQUIREMENTS
            if provider.key in r.cites
        ]
        status = _worst([i.status for i in items])
        reports.append(
            ProviderReport(provider.key, provider.name, provider.rules, provider.url, status, items)
        )
    return reports


# -- gathering the facts -------------------------------------------------------------------


async def _reverse(rt: Runtime, address: str) -> Ptr:
    try:
        found = await dns.rdatas(rt.resolver, reversename.from_address(address).to_text(), "PTR")
        names = [str(r.to_text()).rstrip(".").lower() for r in found]
        ours = ipaddress.ip_address(address)
        for name in names:
            back = await dns.addresses(rt.resolver, name)
            if any(ipaddress.ip_address(a) == ours for a in back):
                return Ptr(address, name, True, True)
        return Ptr(address, names[0] if names else None, False, True)
    except dns.TemporaryDnsError:
        return Ptr(address, None, False, False)


def _recent(tx: Tx, workspace_id: str, domain_id: str, start: datetime) -> tuple[TlsShare, Counts]:
    return (
        recent.tls_share(tx, workspace_id, domain_id, start),
        complaint_rates.since(tx, workspace_id, domain_id, start),
    )


async def gather(rt: Runtime, domain: Domain) -> Facts:
    """The facts about `domain`, looked up now (DNS within DEADLINE)."""
    looked_up: list[tuple[dict[str, str], dict[str, Any]]] = []
    ptrs: dict[str, Ptr] = {}
    addresses: list[str] | None = None

    async def records() -> None:
        looked_up.append(await registry.check_records(rt, domain))

    async def reverse() -> None:
        nonlocal addresses
        try:
            addresses = await spf.sending_addresses(rt)
        except dns.TemporaryDnsError:
            addresses = []
        for address in addresses:
            ptrs[address] = await _reverse(rt, address)

    with trio.move_on_after(DEADLINE):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(records)
            nursery.start_soon(reverse)
    tls, complaints = await rt.db.read(
        _recent, domain.workspace_id, domain.id, rt.clock.now() - COMPLAINT_WINDOW
    )
    checked = domain
    if looked_up:
        statuses, findings = looked_up[0]
        statuses.pop("dkim_mismatch", None)
        checked = replace(
            domain,
            record_status={**domain.record_status, **statuses},
            record_findings={**domain.record_findings, **findings},
        )
    guidance = registry.dns_records(checked, rt.smtp_host, spf.recommended(rt), rt.public_url)
    by_purpose: dict[str, DnsRecord] = {}
    for record in guidance:
        key = record.purpose if record.purpose != "bounce" else f"bounce:{record.type}"
        by_purpose.setdefault(key, record)
    return Facts(
        domain=checked,
        live=bool(looked_up),
        verdicts={
            v.rule: v for v in compliance.evaluate(checked, compliance.inputs(rt, checked)).rules
        },
        records=by_purpose,
        ptrs=None
        if not addresses
        else tuple(ptrs.get(a, Ptr(a, None, False, False)) for a in addresses),
        tls=tls,
        complaints=complaints,
    )


async def report(rt: Runtime, who: Principal, domain_id: str) -> Report:
    """The workspace's domain judged now against each provider's rules (NotFound: not its)."""
    return await report_on(rt, await registry.get(rt, who, domain_id))


async def report_on(rt: Runtime, domain: Domain) -> Report:
    """`domain` (read in its workspace) judged now against each provider's rules."""
    facts = await gather(rt, domain)
    providers = evaluate(facts)
    return Report(
        domain_id=domain.id,
        domain=domain.name,
        checked_at=rt.clock.now(),
        live=facts.live,
        status=_worst([p.status for p in providers]),
        providers=providers,
    )
