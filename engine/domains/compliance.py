"""Whether a domain can send, and whether it meets the bulk-sender rules of the big mailbox
providers (Gmail and Yahoo since February 2024, Outlook.com since May 2025).

"Can send" is the domain's verification, unchanged: its DKIM record is published. The bulk-
sender rules are a table (`RULES`), each judged from what the last DNS check stored and from
inputs other parts of the service own (`Inputs`): SPF authorises the service, DKIM signs, a
DMARC policy (p=none at least) is published and the mail passes it aligned with the From
domain, unsubscribe links are https, and a bounce domain brings bounces and complaints back.
Pure: no DNS here, so every read of a domain can show it. The live report per mailbox
provider (engine/domains/provider_rules.py) judges these same rules on a fresh lookup.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from engine.domains import bounce_domain
from engine.domains.findings import INVALID, MISSING, PENDING, VERIFIED
from engine.mail.link_security import unsubscribe_is_https
from engine.platform.runtime import Runtime
from storage.domains import Domain

PASS, FAIL = "pass", "fail"  # and PENDING: not checked yet


@dataclass(frozen=True, slots=True)
class BounceDomain:
    """A sending domain's own bounce domain (engine/domains/bounce_domain.py, once set)."""

    name: str  # e.g. bounces.example.com: the envelope sender's domain
    verified: bool  # its MX and SPF records are published


@dataclass(frozen=True, slots=True)
class Inputs:
    """What the rules need that the DNS check does not find."""

    unsubscribe_https: bool  # the domain's unsubscribe links are https
    bounce_domain: BounceDomain | None


def inputs(rt: Runtime, domain: Domain) -> Inputs:
    """The inputs as the service knows them: unsubscribe links live under
    POSTROOM_PUBLIC_URL (engine/mail/link_security.py), the bounce domain is the domain's
    own (engine/domains/bounce_domain.py)."""
    bounce = None
    if domain.bounce_domain is not None:
        bounce = BounceDomain(domain.bounce_domain, bounce_domain.in_use(domain))
    return Inputs(unsubscribe_https=unsubscribe_is_https(rt.public_url), bounce_domain=bounce)


@dataclass(frozen=True, slots=True)
class Verdict:
    rule: str
    status: str  # pass, fail, pending
    reason: str


@dataclass(frozen=True, slots=True)
class Compliance:
    can_send: bool  # verified: mail from the domain is signed and accepted for delivery
    bulk_sender_ready: bool  # every rule passes
    rules: list[Verdict]
    dmarc: dict[str, Any] | None  # the parsed policy (engine/domains/dmarc.py), when found


def _status_of(domain: Domain, purpose: str) -> str:
    return domain.record_status.get(purpose, PENDING)


def _detail(domain: Domain, purpose: str, otherwise: str) -> str:
    detail = domain.record_findings.get(purpose, {}).get("detail")
    return str(detail) if detail else otherwise


def _from_record(domain: Domain, purpose: str, passing: str) -> tuple[str, str]:
    status = _status_of(domain, purpose)
    if status == VERIFIED:
        return PASS, _detail(domain, purpose, passing)
    if status in (MISSING, INVALID):
        return FAIL, _detail(domain, purpose, f"the {purpose.upper()} record is {status}")
    return PENDING, _detail(domain, purpose, "not checked in DNS yet")


def _spf(domain: Domain, given: Inputs) -> tuple[str, str]:
    return _from_record(domain, "spf", "the SPF record authorises the service")


def _dkim(domain: Domain, given: Inputs) -> tuple[str, str]:
    return _from_record(
        domain, "dkim", f"mail is signed with d={domain.name}, whose key is published"
    )


def _dmarc(domain: Domain, given: Inputs) -> tuple[str, str]:
    verdict, reason = _from_record(domain, "dmarc", "a DMARC policy is published")
    if verdict != PASS:
        return verdict, reason
    policy = domain.record_findings["dmarc"]["facts"]
    # DKIM: the signature's d= is the From domain itself, aligned in either mode.
    through = ["DKIM"] if _status_of(domain, "dkim") == VERIFIED else []
    # SPF: the envelope sender is bounces+…@ the domain itself, or @ its bounce domain, a
    # subdomain, which aligns only in relaxed mode.
    bounce = given.bounce_domain
    if bounce is not None and bounce.verified:
        if policy["aspf"] == "r":
            through.append("SPF")
    elif _status_of(domain, "spf") == VERIFIED:
        through.append("SPF")
    if not through:
        return FAIL, f"{reason}; mail fails it: neither DKIM nor SPF passes aligned"
    return PASS, f"{reason}; mail passes it aligned through {' and '.join(through)}"


def _unsubscribe(domain: Domain, given: Inputs) -> tuple[str, str]:
    if given.unsubscribe_https:
        return PASS, "one-click unsubscribe links are https"
    return FAIL, "unsubscribe links are not https: set POSTROOM_PUBLIC_URL to an https:// URL"


def _bounce_domain(domain: Domain, given: Inputs) -> tuple[str, str]:
    bounce = given.bounce_domain
    if bounce is None:
        return FAIL, "no bounce domain is set: bounces and complaints may not come back"
    if not bounce.verified:
        return PENDING, f"the records of the bounce domain {bounce.name} are not published yet"
    return PASS, f"bounces and complaints come back through {bounce.name}"


RULES: tuple[tuple[str, Callable[[Domain, Inputs], tuple[str, str]]], ...] = (
    ("spf", _spf),
    ("dkim", _dkim),
    ("dmarc", _dmarc),
    ("unsubscribe_https", _unsubscribe),
    ("bounce_domain", _bounce_domain),
)


def evaluate(domain: Domain, given: Inputs) -> Compliance:
    """Each rule's verdict for the domain, from its last check and the given inputs."""
    rules = [Verdict(name, *judge(domain, given)) for name, judge in RULES]
    dmarc = domain.record_findings.get("dmarc", {}).get("facts") or None
    return Compliance(
        can_send=domain.status == VERIFIED,
        bulk_sender_ready=all(v.status == PASS for v in rules),
        rules=rules,
        dmarc=dmarc if _status_of(domain, "dmarc") == VERIFIED else None,
    )
