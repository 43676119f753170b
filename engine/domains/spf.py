"""A sending domain's SPF record, evaluated (RFC 7208) against the addresses the service sends
from, and what its owner should publish.

The evaluation is pyspf's (the reference implementation): every mechanism, macro, include
chain and processing limit as a receiver applies them. Its DNS lookups go through the
service's own resolver (`rt.resolver`, configured by POSTROOM_DNS_SERVERS), never the
system's: pyspf looks everything up through one method, `query.dns`, which a subclass
overrides, so no global of the library is touched. pyspf is synchronous, so it runs in a
worker thread that asks Trio for each answer.

A record is `verified` when it passes for every sending address; `invalid` when receivers
stop on it with a permanent error (two records, more than 10 lookups, bad syntax) or when it
lets any host send as the domain (`+all`, found by evaluating it for documentation addresses
no one sends from); otherwise `missing`, with the record to publish: the one there, with the
service's mechanism added before its `all`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable, Sequence
from typing import Any

import spf
import trio
from dns.exception import DNSException

from engine.domains.findings import INVALID, MISSING, PENDING, VERIFIED, Finding
from engine.platform import dns
from engine.platform.runtime import Runtime

# Documentation addresses (RFC 5737, RFC 3849): a record that passes them lets anyone send.
PROBES = ("192.0.2.1", "2001:db8::1")
_VERSION = re.compile(r"^v=spf1( |$)", re.IGNORECASE)
_MODIFIER = re.compile(r"^[a-z][a-z0-9_.-]*=", re.IGNORECASE)  # RFC 7208 section 6
# pyspf's permanent errors, in words an owner can act on (first match wins).
PERMANENT_ERRORS: tuple[tuple[str, str], ...] = (
    (
        "two or more",
        "{domain} publishes more than one SPF record, which every receiver treats as a "
        "permanent error (RFC 7208 section 4.5): publish one record",
    ),
    (
        "dns lookups",
        "the SPF record of {domain} needs more than 10 DNS lookups (include, a, mx, ptr, "
        "exists and redirect each count; RFC 7208 section 4.6.4), so receivers stop with a "
        "permanent error: remove includes, or replace some with ip4/ip6 terms",
    ),
    (
        "void lookup",
        "more than two terms of the SPF record of {domain} name hosts that do not exist "
        "(RFC 7208 section 4.6.4), so receivers stop with a permanent error: remove them",
    ),
)


def our_terms(rt: Runtime) -> str:
    """The SPF term(s) that authorise the service: what owners are told to add."""
    if rt.spf_include:
        return f"include:{rt.spf_include}"
    if rt.sending_addresses:
        return " ".join(f"ip{ipaddress.ip_address(a).version}:{a}" for a in rt.sending_addresses)
    return f"a:{rt.smtp_host}"


def recommended(rt: Runtime) -> str:
    """The record to publish at a domain that has none."""
    return f"v=spf1 {our_terms(rt)} ~all"


async def sending_addresses(rt: Runtime) -> list[str]:
    """The addresses the service's mail leaves from: POSTROOM_SENDING_ADDRESSES, else the
    addresses of POSTROOM_SMTP_HOST (through the service's resolver)."""
    if rt.sending_addresses:
        return list(rt.sending_addresses)
    return await dns.addresses(rt.resolver, rt.smtp_host)


class _Query(spf.query):  # type: ignore[misc]  # pyspf has no type hints
    """pyspf's evaluation, its lookups answered by `lookup` instead of the system resolver."""

    def __init__(self, lookup: Callable[[str, str], list[Any]], ip: str, sender: str, helo: str):
        super().__init__(i=ip, s=sender, h=helo, strict=True)
        self._lookup = lookup

    def dns(
        self, name: str, qtype: str, cnames: object = None, ignore_void: bool = False
    ) -> list[Any]:
        # The contract of pyspf's own `dns`: a list of values per type, [] for none, void
        # lookups counted. CNAMEs are followed by the resolver itself.
        name = str(name).rstrip(".").lower()
        if not all(0 < len(label) < 64 for label in name.split(".")):
            return []
        result = self._lookup(name, qtype)
        if not result and not ignore_void:
            self.void_lookups += 1
            if self.void_lookups > spf.MAX_VOID_LOOKUPS:
                raise spf.PermError(f"Void lookup limit of {spf.MAX_VOID_LOOKUPS} exceeded")
        return result


def _value(rdata: Any, qtype: str) -> Any:
    """An answer as pyspf's lookups give it."""
    match qtype:
        case "A" | "AAAA":
            return rdata.address
        case "MX":
            return (int(rdata.preference), rdata.exchange.to_text(omit_final_dot=True))
        case "PTR":
            return rdata.target.to_text(omit_final_dot=True)
        case _:  # TXT (and SPF, type 99): the character-strings as bytes
            return list(rdata.strings)


def _lookups_through(rt: Runtime) -> Callable[[str, str], list[Any]]:
    """A lookup for a worker thread: asks the service's resolver in Trio, answers cached, so
    the evaluations of one check share them."""
    cache: dict[tuple[str, str], list[Any]] = {}

    def lookup(name: str, qtype: str) -> list[Any]:
        if (name, qtype) not in cache:
            try:
                found = trio.from_thread.run(dns.rdatas, rt.resolver, name, qtype)
            except dns.TemporaryDnsError as exc:
                raise spf.TempError(f"DNS {exc}") from exc
            except DNSException as exc:  # a name no DNS query can carry (over 255 bytes)
                raise spf.PermError(f"{name} cannot be looked up: {exc}") from exc
            cache[(name, qtype)] = [_value(r, qtype) for r in found]
        return list(cache[(name, qtype)])  # pyspf sorts MX answers in place

    return lookup


def _evaluate_all(
    lookup: Callable[[str, str], list[Any]], domain: str, helo: str, ips: Sequence[str]
) -> tuple[list[str], dict[str, tuple[str, str]]]:
    """In a worker thread: the published SPF records, and (result, pyspf's reason) per ip."""
    published = [
        text
        for text in (
            b"".join(strings).decode("utf-8", "replace") for strings in _txt(lookup, domain)
        )
        if _VERSION.match(text)
    ]
    results: dict[str, tuple[str, str]] = {}
    for ip in ips:
        query = _Query(lookup, ip, f"bounces@{domain}", helo)
        result, _code, explanation = query.check()
        # An error's explanation is "SPF Permanent Error: <what>: <the term>".
        reason = explanation.split(": ", 1)[-1] if result.endswith("error") else explanation
        results[ip] = (result, reason)
    return published, results


def _txt(lookup: Callable[[str, str], list[Any]], domain: str) -> list[list[bytes]]:
    try:
        return lookup(domain, "TXT")
    except spf.TempError:
        return []  # the evaluations meet the same failure and say so


async def check(rt: Runtime, domain: str) -> Finding:
    """Evaluate the SPF record of `domain` for the service's sending addresses."""
    try:
        ours = await sending_addresses(rt)
    except dns.TemporaryDnsError as exc:
        return Finding(PENDING, f"the service's own addresses could not be looked up: {exc}")
    if not ours:
        return Finding(
            PENDING,
            f"the addresses the service sends from are unknown: {rt.smtp_host} has no A or "
            "AAAA record and POSTROOM_SENDING_ADDRESSES is not set",
        )
    published, results = await trio.to_thread.run_sync(
        _evaluate_all, _lookups_through(rt), domain, rt.smtp_host, [*ours, *PROBES]
    )
    return judge(domain, published, results, ours, our_terms(rt))


def judge(
    domain: str,
    published: list[str],
    results: dict[str, tuple[str, str]],
    ours: Sequence[str],
    terms: str,
) -> Finding:
    """The finding from what the evaluations gave (`results`: (result, reason) per address,
    ours and the PROBES)."""
    facts: dict[str, Any] = {
        "records": published,
        "results": {ip: results[ip][0] for ip in ours},
    }
    outcomes = [results[ip] for ip in (*ours, *PROBES)]
    if any(result == "temperror" for result, _ in outcomes):
        reason = next(reason for result, reason in outcomes if result == "temperror")
        return Finding(PENDING, f"DNS could not answer: {reason}", facts=facts)
    permanent = next((reason for result, reason in outcomes if result == "permerror"), None)
    if permanent is not None:
        detail = next(
            (text for key, text in PERMANENT_ERRORS if key in permanent.lower()),
            "receivers stop on the SPF record of {domain} with a permanent error: "
            + permanent.replace("{", "{{").replace("}", "}}"),
        ).format(domain=domain)
        suggested = merged(published, terms) if len(published) > 1 else None
        return Finding(INVALID, detail, suggested, facts)
    if not published:
        return Finding(MISSING, f"{domain} publishes no SPF record", facts=facts)
    if any(results[probe][0] == "pass" for probe in PROBES):
        return Finding(
            INVALID,
            f"the SPF record of {domain} lets every host on the internet send as it (it "
            f"passes {PROBES[0]}, an address no one sends from; `+all` does that): end it "
            "with ~all or -all",
            _without_plus_all(published[0]),
            facts,
        )
    failing = [ip for ip in ours if results[ip][0] != "pass"]
    if not failing:
        return Finding(VERIFIED, f"the SPF record authorises {', '.join(ours)}", facts=facts)
    suggestion = merged(published, terms)
    return Finding(
        MISSING,
        f"the SPF record of {domain} does not authorise {', '.join(failing)} (the result is "
        f"{results[failing[0]][0]}): add {terms}{_placement(published[0])}, giving "
        f"{suggestion}",
        suggestion,
        facts,
    )


def _placement(record: str) -> str:
    last = _all_term(record.split()[1:])
    return f" before {last}" if last else ""


def _all_term(terms: list[str]) -> str | None:
    return next((t for t in terms if t.lower().lstrip("+-~?") == "all"), None)


def merged(published: list[str], terms: str) -> str:
    """One SPF record that keeps every term of the published ones, in order and once, with
    the service's `terms` added before the `all`. DNS gives records in no set order, so the
    owner's own come first (those without the service's terms; otherwise in the order
    given), and the first one's `all` wins."""
    ours = {t.lower() for t in terms.split()}
    mechanisms: list[str] = []
    modifiers: dict[str, str] = {}
    last: str | None = None
    for record in sorted(published, key=lambda r: bool(ours & set(r.lower().split()))):
        for term in record.split()[1:]:
            if (match := _MODIFIER.match(term)) is not None:
                modifiers.setdefault(match.group(0).lower(), term)
            elif term.lower().lstrip("+-~?") == "all":
                last = last or term
            elif term.lower() not in (m.lower() for m in mechanisms):
                mechanisms.append(term)
    for term in terms.split():
        if term.lower() not in (m.lower() for m in mechanisms):
            mechanisms.append(term)
    if last is not None:
        modifiers.pop("redirect=", None)  # never used beside an `all` (RFC 7208 section 6.1)
    tail = [last] if last is not None else []
    return " ".join(["v=spf1", *mechanisms, *tail, *modifiers.values()])


def _without_plus_all(record: str) -> str | None:
    """The record with a `+all` (or bare `all`) made `~all`; None when it has none."""
    terms = record.split()
    changed = ["~all" if t.lower() in ("all", "+all") else t for t in terms]
    return " ".join(changed) if changed != terms else None
