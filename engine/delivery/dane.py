"""DANE for SMTP (RFC 7672) on the way out: TLSA records that bind an MX host's TLS.

With POSTROOM_DNSSEC on, each MX host named by an authenticated (AD) MX answer has its
`_<port>._tcp.<host>` TLSA records looked up once per round (`lookup`); when that answer is
authenticated too and holds a usable record, the host is spoken to only over STARTTLS whose
presented certificates match one (`check`); otherwise it is passed over (`tls_policy`),
never spoken to in plain text. A failed TLSA lookup for such a host passes it over as well
(2.1.1); an insecure MX or TLSA answer, or none, is no DANE for the host. A domain without MX
records is its own host (`_<port>._tcp.<domain>`, and the name DANE-TA checks) when the
denial of its MX records and its address answers are authenticated, not through a CNAME
(2.2.2: engine/delivery/mx.py).

Usable records (RFC 7672 3.1): DANE-TA(2) and DANE-EE(3), selector 0 (the certificate) or
1 (its SubjectPublicKeyInfo), matching type 0 (exact), 1 (SHA-256) or 2 (SHA-512); PKIX-TA(0)
and PKIX-EE(1) are unusable for SMTP (3.1.3) and a set of unusable records is no DANE.
DANE-EE matches the leaf, with no name or expiry check (3.1.1); DANE-TA matches a
certificate the server presented above its leaf, and the leaf must chain up to it and name
the MX host (3.1.2, checked by cryptography's verifier: its subjectAltName, not the CN
of 3.2.3; validity dates are checked).

Python's ssl cannot check TLSA records: the handshake runs without verification and the
chain the server presented is checked here before anything else is said (engine/smtp/
session.py `connect`'s `check`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from cryptography.x509.verification import (
    Criticality,
    ExtensionPolicy,
    PolicyBuilder,
    Store,
    VerificationError,
)

from engine.delivery.mx import MxTarget
from engine.platform import dns as lookups
from engine.platform.runtime import Runtime

DANE_TA = 2
DANE_EE = 3
_DIGESTS = {1: hashlib.sha256, 2: hashlib.sha512}
# DANE-TA anchors are often private CAs, whose leaves break the Web PKI's extension rules
# (a critical subjectAltName beside a subject, no extended key usage): the leaf needs only
# the subjectAltName the name is checked against; the CAs keep the Web PKI's rules.
_LEAF_RULES = ExtensionPolicy.permit_all().require_present(
    x509.SubjectAlternativeName, Criticality.AGNOSTIC, None
)


@dataclass(frozen=True, slots=True)
class Tlsa:
    """One TLSA record (RFC 6698 2.1)."""

    usage: int
    selector: int
    mtype: int
    data: bytes


def usable(records: Sequence[tuple[int, int, int, bytes]]) -> tuple[Tlsa, ...]:
    """The records SMTP may use (RFC 7672 3.1); an empty result is no DANE."""
    return tuple(
        Tlsa(*record)
        for record in records
        if record[0] in (DANE_TA, DANE_EE) and record[1] in (0, 1) and record[2] in (0, 1, 2)
    )


Hosts = dict[str, tuple[Tlsa, ...] | str]  # MX host -> its usable records, or why to pass over


async def lookup(rt: Runtime, targets: Sequence[MxTarget]) -> Hosts:
    """The MX hosts DANE covers: each with its usable TLSA records, or why it must be passed
    over (the lookup failed). Nothing is looked up with POSTROOM_DNSSEC off, nor for a host
    whose MX answer was not authenticated."""
    found: Hosts = {}
    if not rt.dnssec:
        return found
    for target in targets:
        if not target.secure:
            continue
        name = f"_{rt.delivery_port}._tcp.{target.host}"
        try:
            records, secure = await lookups.tlsa(rt.resolver, name)
        except lookups.TemporaryDnsError as exc:
            found[target.host] = f"the TLSA lookup for {target.host} failed: {exc}"
            continue
        mine = usable(records) if secure else ()
        if mine:
            found[target.host] = mine
    return found


def check(records: Sequence[Tlsa], chain: Sequence[bytes], host: str, now: datetime) -> str | None:
    """None when the presented `chain` (DER, leaf first) matches one of `records` for the MX
    `host`; else why not."""
    try:
        certificates = [x509.load_der_x509_certificate(der) for der in chain]
    except ValueError as exc:
        return f"the server presented an unreadable certificate: {exc}"
    if not certificates:
        return "the server presented no certificate"
    leaf = certificates[0]
    if any(r.usage == DANE_EE and _matches(r, leaf) for r in records):
        return None
    why = "no TLSA record matches the certificates the server presented"
    for record in records:
        if record.usage != DANE_TA:
            continue
        for above, anchor in enumerate(certificates[1:], start=1):
            if _matches(record, anchor):
                problem = _chains_up(leaf, certificates[1:above], anchor, host, now)
                if problem is None:
                    return None
                why = f"the certificate does not chain to the TLSA trust anchor: {problem}"
    return why


def _matches(record: Tlsa, certificate: x509.Certificate) -> bool:
    if record.selector == 0:
        selected = certificate.public_bytes(Encoding.DER)
    else:
        try:
            key = certificate.public_key()
        except UnsupportedAlgorithm:  # a stranger's key type cryptography cannot read
            return False  # matches no record by its key (the round goes on, never raises)
        selected = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    digest = _DIGESTS.get(record.mtype)
    return (selected if digest is None else digest(selected).digest()) == record.data


def _chains_up(
    leaf: x509.Certificate,
    between: Sequence[x509.Certificate],
    anchor: x509.Certificate,
    host: str,
    now: datetime,
) -> str | None:
    """None when `leaf` chains up to `anchor` (through `between`) and names `host`."""
    try:
        verifier = (
            PolicyBuilder()
            .store(Store([anchor]))
            .time(now)
            .extension_policies(
                ca_policy=ExtensionPolicy.webpki_defaults_ca(), ee_policy=_LEAF_RULES
            )
            .build_server_verifier(x509.DNSName(host))
        )
        verifier.verify(leaf, list(between))
    except (VerificationError, ValueError) as exc:
        return str(exc)
    return None
