"""A sending domain's DMARC policy (RFC 7489): found in DNS, parsed, and described.

The record is looked for at `_dmarc.<domain>`, then at each parent name up to the one below
the top-level domain (the tree walk of DMARCbis, which needs no public suffix list); found at
a parent, its subdomain policy `sp` applies. Only TXT records that start with `v=DMARC1`
count, and more than one at a name means none applies (section 6.6.3). Unknown tags are
ignored, as the RFC requires; a bad `p` without a usable `rua` makes the record invalid.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass

from engine.domains.findings import INVALID, MISSING, PENDING, VERIFIED, Finding
from engine.platform import dns
from engine.platform.runtime import Runtime

_VERSION = re.compile(r"^\s*v\s*=\s*DMARC1\b", re.IGNORECASE)
POLICIES = ("none", "quarantine", "reject")
# The local part the DMARC record we advise names in `rua`; the inbound MX reads the
# aggregate reports sent to it (engine/forwarding/dmarc_reports.py builds on this).
REPORTS_LOCAL_PART = "dmarc"
ALIGNMENTS = ("r", "s")


class InvalidRecord(Exception):
    """Raised by `parse` for a record receivers discard; the message says why."""


@dataclass(frozen=True, slots=True)
class Policy:
    host: str  # where the record was found, e.g. `_dmarc.example.com`
    inherited: bool  # found at a parent of the domain: `subdomain_policy` applies to it
    policy: str  # p
    subdomain_policy: str  # sp, else p
    adkim: str  # DKIM alignment: r (relaxed, the default) or s (strict)
    aspf: str  # SPF alignment, likewise
    pct: int
    rua: list[str]  # where aggregate reports go
    ruf: list[str]  # where failure reports go

    @property
    def applied(self) -> str:
        """The policy receivers apply to the checked domain's failing mail."""
        return self.subdomain_policy if self.inherited else self.policy


def _tags(text: str) -> dict[str, str]:
    tags: dict[str, str] = {}
    for part in text.split(";"):
        if not part.strip():
            continue
        name, sep, value = part.partition("=")
        name = name.strip().lower()
        if not sep or not re.fullmatch(r"[a-z][a-z0-9_]*", name) or re.search(r"\s\w+\s*=", value):
            raise InvalidRecord(
                f"{part.strip()!r} is not a tag=value pair (tags are separated by semicolons)"
            )
        if name in tags:
            raise InvalidRecord(f"the tag {name} appears twice")
        tags[name] = value.strip()
    return tags


def _uris(tags: dict[str, str], name: str) -> list[str]:
    uris = [u.strip() for u in tags.get(name, "").split(",") if u.strip()]
    for uri in uris:
        if not re.fullmatch(r"[a-z][a-z0-9+.-]*:\S+", uri, re.IGNORECASE):
            raise InvalidRecord(f"{name} must list URIs such as mailto:dmarc@example.com")
    return uris


def _choice(tags: dict[str, str], name: str, allowed: tuple[str, ...], default: str) -> str:
    value = tags.get(name, default).lower()
    if value not in allowed:
        raise InvalidRecord(f"{name}={tags[name]} is not one of {', '.join(allowed)}")
    return value


def parse(text: str, host: str, *, inherited: bool = False) -> Policy:
    """The policy a `v=DMARC1` record states; InvalidRecord when receivers would discard it."""
    tags = _tags(text)
    if tags.get("v") != "DMARC1" or next(iter(tags)) != "v":
        raise InvalidRecord("the record must begin with v=DMARC1")
    rua = _uris(tags, "rua")
    if "p" not in tags and not rua:
        raise InvalidRecord("the record has no policy (p=none, quarantine or reject)")
    try:
        policy = _choice(tags, "p", POLICIES, "none")
    except InvalidRecord:
        if not rua:
            raise
        policy = "none"  # section 6.6.3: a bad p with a usable rua is read as none
    pct = tags.get("pct", "100")
    if not pct.isdigit() or not 0 <= int(pct) <= 100:
        raise InvalidRecord(f"pct={pct} is not a whole number from 0 to 100")
    return Policy(
        host=host,
        inherited=inherited,
        policy=policy,
        subdomain_policy=_choice(tags, "sp", POLICIES, policy),
        adkim=_choice(tags, "adkim", ALIGNMENTS, "r"),
        aspf=_choice(tags, "aspf", ALIGNMENTS, "r"),
        pct=int(pct),
        rua=rua,
        ruf=_uris(tags, "ruf"),
    )


def names_to_try(domain: str) -> list[str]:
    """The domain, then each parent above it that is not a top-level domain."""
    labels = domain.split(".")
    return [".".join(labels[i:]) for i in range(max(len(labels) - 1, 1))]


def describe(policy: Policy) -> str:
    where = (
        f"{policy.host} (a parent's record: its sp applies)" if policy.inherited else policy.host
    )
    reports = f"aggregate reports go to {', '.join(policy.rua)}" if policy.rua else "no rua"
    return (
        f"p={policy.applied} at {where}; alignment adkim={policy.adkim} aspf={policy.aspf}; "
        f"{reports}"
    )


async def applied_policy(rt: Runtime, domain: str) -> str | None:
    """The policy receivers apply to the domain's failing mail; None when no valid record
    applies or DNS could not answer."""
    finding = await check(rt, domain)
    return Policy(**finding.facts).applied if finding.status == VERIFIED else None


async def check(rt: Runtime, domain: str) -> Finding:
    """The DMARC policy that applies to `domain`, as a finding whose facts are the policy."""
    for name in names_to_try(domain):
        host = f"_dmarc.{name}"
        try:
            records = [r for r in await dns.txt(rt.resolver, host) if _VERSION.match(r)]
        except dns.TemporaryDnsError as exc:
            return Finding(PENDING, f"DNS could not answer: {exc}")
        if not records:
            continue
        if len(records) > 1:
            return Finding(
                INVALID,
                f"{host} publishes {len(records)} DMARC records, so receivers apply none "
                "(RFC 7489 section 6.6.3): publish one",
            )
        try:
            policy = parse(records[0], host, inherited=name != domain)
        except InvalidRecord as exc:
            return Finding(
                INVALID, f"receivers discard the DMARC record at {host}: {exc}", facts={}
            )
        return Finding(VERIFIED, describe(policy), facts=asdict(policy))
    return Finding(
        MISSING,
        f"no DMARC record at _dmarc.{domain} or a parent domain: Gmail, Yahoo and Microsoft "
        "require one (p=none at least) of bulk senders",
    )
