"""DANE on the way out (RFC 7672, issue 31): with POSTROOM_DNSSEC on, a real DNS server on
loopback that sets the AD bit for the names a test marks secure serves the MX and TLSA
records, and a real SMTP sink presents a certificate from the test CA that the TLSA records
do or do not match."""

from __future__ import annotations

import hashlib
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from engine.delivery import dane
from tests import test_mta_sts
from tests.harness import service as harness
from tests.harness.sending import ready_account
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.test_mta_sts import (
    DOMAIN,
    _deferred,
    _delivered,
    _events,
    _Loopback,
    _policy,
    _send,
    _tls_counts,
)

# The peers of test_mta_sts.py (a DNS server, an HTTPS policy server, the test CA).
loopback = test_mta_sts.loopback
policy_server = test_mta_sts.policy_server

MX = f"mx.{DOMAIN}"
# DANE keeps nothing in the database: one engine is enough for the scenarios end to end.
one_engine = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _spki_sha256(pem: bytes) -> str:
    key = x509.load_pem_x509_certificate(pem).public_key()
    return hashlib.sha256(
        key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    ).hexdigest()


async def _sink(
    loopback: _Loopback, issuer: trustme.CA, *names: str
) -> tuple[SmtpSink, list[bytes]]:
    """A sink offering STARTTLS with a certificate `issuer` made for `names`; its chain (PEM)."""
    context = loopback.tls_ca.server_context()
    leaf = issuer.issue_cert(*names)
    leaf.configure_cert(context)
    sink = SmtpSink(context)
    await loopback.nursery.start(sink.run)
    return sink, [blob.bytes() for blob in leaf.cert_chain_pems]


def _publish(loopback: _Loopback, sink: SmtpSink, tlsa: str, *, secure: bool = True) -> str:
    """The domain's MX on loopback and its TLSA record; the MX and TLSA answers are
    authenticated when `secure`. The TLSA name, which is looked up at the delivery port."""
    dns_server = loopback.dns
    dns_server.set(DOMAIN, "MX", [f"10 {MX}."])
    dns_server.set(MX, "A", ["127.0.0.1"])
    name = f"_{sink.port}._tcp.{MX}"
    dns_server.set(name, "TLSA", [tlsa])
    if secure:
        dns_server.secure(DOMAIN, name)
    return name


def _service(
    loopback: _Loopback, sink: SmtpSink, dnssec: str = "on"
) -> AbstractAsyncContextManager[Service]:
    settings = harness.test_settings(
        loopback.database_url,
        loopback.dns,
        delivery_port=str(sink.port),
        mta_sts_port=str(loopback.policy_server.port),
        extra_ca_file=str(loopback.tls_ca.ca_file),
        dnssec=dnssec,
    )
    return harness.started(loopback.nursery, settings, loopback.clock)


@one_engine
async def test_dane_ee_match_delivers_with_policy_dane_and_no_name_check(
    loopback: _Loopback,
) -> None:
    # The certificate names neither the MX host nor anything else the client knows.
    sink, chain = await _sink(loopback, loopback.tls_ca.ca, "somewhere.else.example")
    _publish(loopback, sink, f"3 1 1 {_spki_sha256(chain[0])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "dane" and delivered["tls"]["verified"] is True
        assert [m.tls for m in sink.messages] == [True]
        counts = await _tls_counts(service)
        assert counts[("dane", "verified")] == 1


@one_engine
async def test_dane_ee_mismatch_defers_and_never_sends_in_plain_text(
    loopback: _Loopback,
) -> None:
    sink, _ = await _sink(loopback, loopback.tls_ca.ca, MX)  # valid for the name: no matter
    _publish(loopback, sink, f"3 1 1 {'00' * 32}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _deferred)
        [deferred, *_] = _events(done, "deferred")
        assert deferred["policy"] == "dane" and deferred["reason"] == "tls_policy"
        assert "no TLSA record matches" in deferred["response"]
        assert sink.messages == []
        assert not any(line.startswith("MAIL") for line in sink.transcript)


@one_engine
async def test_dane_ta_match_checks_the_chain_and_the_mx_name(loopback: _Loopback) -> None:
    intermediate = loopback.tls_ca.ca.create_child_ca()
    sink, chain = await _sink(loopback, intermediate, MX)
    assert len(chain) == 2  # the sink presents its intermediate, the trust anchor
    _publish(loopback, sink, f"2 1 1 {_spki_sha256(chain[1])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "dane" and delivered["tls"]["verified"] is True


def test_dane_ta_refuses_a_leaf_for_another_name_and_pkix_usages_are_unusable() -> None:
    ca = trustme.CA()
    intermediate = ca.create_child_ca()
    pems = [blob.bytes() for blob in intermediate.issue_cert("other.example").cert_chain_pems]
    chain = [x509.load_pem_x509_certificate(p).public_bytes(Encoding.DER) for p in pems]
    anchor = dane.Tlsa(2, 1, 1, bytes.fromhex(_spki_sha256(pems[1])))
    now = datetime.now(UTC)
    assert dane.check([anchor], chain, "other.example", now) is None
    problem = dane.check([anchor], chain, MX, now)
    assert problem is not None and "subjectAltName" in problem
    full = dane.Tlsa(3, 0, 0, chain[0])  # the whole leaf, exact
    assert dane.check([full], chain, MX, now) is None
    pkix = [(0, 1, 1, anchor.data), (1, 0, 0, chain[0]), (3, 2, 1, b""), (2, 1, 9, b"")]
    assert dane.usable(pkix) == ()  # RFC 7672 3.1.3, and unknown selectors and types


@one_engine
async def test_without_the_ad_bit_delivery_is_opportunistic(loopback: _Loopback) -> None:
    sink, _ = await _sink(loopback, loopback.tls_ca.ca, MX)
    _publish(loopback, sink, f"3 1 1 {'00' * 32}", secure=False)  # would not match
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "opportunistic"
        assert delivered["tls"]["verified"] is False


@one_engine
async def test_with_dnssec_off_nothing_is_asked_and_delivery_is_opportunistic(
    loopback: _Loopback,
) -> None:
    sink, _ = await _sink(loopback, loopback.tls_ca.ca, MX)
    name = _publish(loopback, sink, f"3 1 1 {'00' * 32}")  # secure, and would not match
    async with _service(loopback, sink, dnssec="off") as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "opportunistic"
        assert not [q for q in loopback.dns.queries if q.name == name]


@one_engine
async def test_a_failed_tlsa_lookup_for_a_secure_mx_defers(loopback: _Loopback) -> None:
    sink, _ = await _sink(loopback, loopback.tls_ca.ca, MX)
    name = _publish(loopback, sink, f"3 1 1 {'00' * 32}")
    loopback.dns.fail(name)
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _deferred)
        [deferred, *_] = _events(done, "deferred")
        assert deferred["policy"] == "dane" and deferred["reason"] == "tls_policy"
        assert "TLSA lookup" in deferred["response"]
        assert sink.messages == []


@one_engine
async def test_dane_wins_over_an_mta_sts_policy(loopback: _Loopback) -> None:
    sink, chain = await _sink(loopback, loopback.tls_ca.ca, "localhost")
    # MTA-STS enforce lists another host and the certificate fails its name check: under
    # MTA-STS alone the mail would wait. DANE covers the host and matches.
    loopback.publish(DOMAIN, "1", 200, _policy("enforce", "mx.elsewhere.example"))
    _publish(loopback, sink, f"3 1 1 {_spki_sha256(chain[0])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "dane" and delivered["tls"]["verified"] is True
