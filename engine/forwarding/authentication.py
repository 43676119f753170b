"""What the inbound MX finds out about a message it accepts for forwarding, written at the
top of the stored message as it arrived: its `Received:` field (RFC 5321 4.4) and an
`Authentication-Results:` field (RFC 8601) under the service's host name, which the ARC set
of each forwarded copy carries on (engine/mail/arc.py).

Honest results only: each DKIM signature verified with dkimpy (keys fetched through the
service's resolver first; dkimpy's own lookups are synchronous), an existing ARC chain
verified the same way (`arc=`), and DMARC `pass` when a signature aligned with the From
domain verified and the domain (or its parent, the last two labels: no public suffix
list here) publishes a DMARC record, `none` when it publishes none. SPF is not
evaluated here, so a DMARC verdict that would need it is left out rather than guessed.
A message over `arc.MAX_SIZE` is not verified (`dkim=neutral`, too large). Any
`Authentication-Results` already claiming our host name is removed (RFC 8601 5: a
forger's field must not pass for ours).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from email.utils import getaddresses

import dkim as dkimpy
import dns.asyncresolver
import dns.exception
import trio

from engine.mail import arc, trace
from engine.platform import dns as lookups

_TOKEN = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,250}[A-Za-z0-9])?")
MAX_KEYS = 10  # signatures' keys fetched for one message: bounds the work a sender causes
_TAG = re.compile(r"\s*([a-z]+)\s*=\s*([^;]*)")
_FIELD = rb"(?im)^%s[ \t]*:.*\r\n(?:[ \t].*\r\n)*"
_SIGNATURES = re.compile(_FIELD % rb"(?:dkim-signature|arc-seal|arc-message-signature)")


@dataclass(frozen=True, slots=True)
class _Keys:
    """The DKIM key records fetched for a message: name -> TXT (None: no record; absent:
    DNS did not answer)."""

    found: dict[str, str | None]

    def lookup(self, name: bytes, timeout: int = 5) -> bytes | None:
        record = self.found.get(name.decode("ascii", "replace").rstrip(".").lower())
        return None if record is None else record.encode()


def _tags(value: bytes) -> dict[str, str]:
    text = "".join(value.decode("ascii", "replace").split())
    return {m[1].lower(): m[2] for m in _TAG.finditer(text.replace(";", "; "))}


def _signers(header: bytes) -> list[tuple[str, str, str]]:
    """(field name, domain, selector) of every DKIM and ARC signature in the header, in
    order (a signature without d= or s= has empty ones: it cannot verify)."""
    found = []
    for field in _SIGNATURES.findall(header):
        name, _, value = field.partition(b":")
        tags = _tags(value)
        found.append((name.strip().lower().decode(), tags.get("d", "").lower(), tags.get("s", "")))
    return found


async def _fetch_keys(resolver: dns.asyncresolver.Resolver, names: list[str]) -> _Keys:
    found: dict[str, str | None] = {}
    for name in names[:MAX_KEYS]:
        try:
            records = await lookups.txt(resolver, name)
        except (lookups.TemporaryDnsError, dns.exception.DNSException):
            continue
        found[name] = records[0] if records else None
    return _Keys(found)


async def _dmarc_record(resolver: dns.asyncresolver.Resolver, domain: str) -> bool | None:
    """Whether the domain or its parent publishes DMARC; None when DNS did not answer."""
    labels = domain.split(".")
    for name in dict.fromkeys([domain, ".".join(labels[-2:])]):
        try:
            records = await lookups.txt(resolver, f"_dmarc.{name}")
        except (lookups.TemporaryDnsError, dns.exception.DNSException):
            return None
        if any(r.strip().lower().startswith("v=dmarc1") for r in records):
            return True
    return False


def _aligned(signer: str, author: str) -> bool:
    return author == signer or author.endswith("." + signer) or signer.endswith("." + author)


def _verified(data: bytes, count: int, keys: _Keys, arc: bool) -> tuple[list[bool], str | None]:
    """Each DKIM signature's verdict, and the ARC chain's (None: no chain). CPU-bound."""
    # A stranger's header is hostile input, and dkimpy raises more than its own errors on
    # some (bad base64, odd tags): whatever it raises is a failed verification, never a
    # reason to refuse the message.
    verdicts = []
    for index in range(count):
        try:
            verdicts.append(bool(dkimpy.DKIM(data).verify(idx=index, dnsfunc=keys.lookup)))
        except Exception:
            verdicts.append(False)
    chain = None
    if arc:
        try:
            result, _, _ = dkimpy.arc_verify(data, dnsfunc=keys.lookup)
            chain = result.decode()
        except Exception:
            chain = "fail"
    return verdicts, chain


def _without_ours(header: bytes, host: str) -> bytes:
    claim = rb"authentication-results(?=[ \t]*:[ \t]*" + re.escape(host.encode()) + rb"[ \t]*;)"
    return re.sub(_FIELD % claim, b"", header)


def _key_name(domain: str, selector: str) -> str | None:
    """Where a signature's key is published; None when its d= or s= is no DNS name."""
    if _TOKEN.fullmatch(domain) and _TOKEN.fullmatch(selector):
        return f"{selector}._domainkey.{domain}"
    return None


def _dkim_result(keys: _Keys, name: str, verified: bool) -> str:
    if name not in keys.found:
        return "temperror"  # DNS did not answer (or the message has too many signatures)
    if keys.found[name] is None:
        return "permerror"  # no key published for the signature
    return "pass" if verified else "fail"


def _author_domain(header: bytes) -> str | None:
    fields = re.findall(_FIELD % rb"from", header)
    if len(fields) != 1:  # none, or several: no single author domain to align with
        return None
    value = fields[0].split(b":", 1)[1].decode("utf-8", "replace")
    addresses = [a for _, a in getaddresses([value]) if "@" in a]
    if len(addresses) != 1:
        return None
    domain = addresses[0].rpartition("@")[2].lower()
    return domain if _TOKEN.fullmatch(domain) else None


async def stamped(
    resolver: dns.asyncresolver.Resolver,
    host: str,
    arrival: trace.Arrival,
    recipients: list[str],
    data: bytes,
    when: datetime,
) -> bytes:
    """The message as the MX keeps it: under its `Authentication-Results:` and `Received:`
    fields, without any `Authentication-Results` that claimed to be ours."""
    end = data.find(b"\r\n\r\n")
    header, body = (
        (data, memoryview(b"")) if end < 0 else (data[: end + 2], memoryview(data)[end + 2 :])
    )
    header = _without_ours(header, host)
    signatures = [(d, s) for kind, d, s in _signers(header) if kind == "dkim-signature"]
    chained = any(kind == "arc-seal" for kind, _, _ in _signers(header))
    checked = len(data) <= arc.MAX_SIZE
    verdicts: list[bool] = []
    chain = None
    if checked:
        names = [_key_name(d, s) for _, d, s in _signers(header)]
        keys = await _fetch_keys(resolver, list(dict.fromkeys(n for n in names if n is not None)))
        verdicts, chain = await trio.to_thread.run_sync(
            _verified, header + body, len(signatures), keys, chained
        )
    results = []
    aligned_pass = False
    author = _author_domain(header)
    for i, (domain, selector) in enumerate(signatures):
        name = _key_name(domain, selector)
        if name is None:
            results.append("dkim=permerror")  # no usable d= or s=
            continue
        if not checked:  # RFC 8601 2.7.1: signed, but could not be processed
            results.append(f'dkim=neutral reason="too large to verify" header.d={domain}')
            continue
        result = _dkim_result(keys, name, verdicts[i])
        aligned_pass |= result == "pass" and author is not None and _aligned(domain, author)
        results.append(f"dkim={result} header.d={domain} header.s={selector}")
    if chain is not None:
        results.append(f"arc={chain}")
    if author is not None:
        published = await _dmarc_record(resolver, author)
        if published is None:
            results.append(f"dmarc=temperror header.from={author}")
        elif not published:
            results.append(f"dmarc=none header.from={author}")
        elif aligned_pass:
            results.append(f"dmarc=pass header.from={author}")
    field = f"Authentication-Results: {host};" + (
        ";".join(f"\r\n\t{r}" for r in results) if results else " none"
    )
    received = trace.received_field(arrival, host, trace.trace_id(), recipients, when)
    return b"".join([(field + "\r\n").encode(), received, header, body])  # the body copied once
