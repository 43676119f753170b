"""DANE on the way out (RFC 7672, issue 31): with POSTROOM_DNSSEC on, a real DNS server on
loopback that sets the AD bit for the names a test marks secure serves the MX and TLSA
records, and a real SMTP sink presents a certificate from the test CA that the TLSA records
do or do not match."""

from __future__ import annotations

from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime
from typing import Any

import pytest
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from engine.delivery import dane
from tests.harness import service as harness
from tests.harness import tls_policies
from tests.harness.sending import ready_account
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls_policies import (
    DOMAIN,
    MX,
    Loopback,
    dane_sink,
    delivered_without_policy,
    events_of,
    is_delivered,
    publish_tlsa,
    send_until,
    spki_sha256,
    sts_policy,
    tls_counts,
    was_deferred,
)

# The peers of tests/harness/tls_policies.py (a DNS server, an HTTPS policy server, the test CA).
loopback = tls_policies.loopback
policy_server = tls_policies.policy_server

# DANE keeps nothing in the database: one engine is enough for the scenarios end to end.
one_engine = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)


def _service(
    loopback: Loopback, sink: SmtpSink, dnssec: str = "on"
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


def _refused_under_dane(done: dict[str, Any], sink: SmtpSink) -> None:
    """The email waits: DANE passed the host over, and the sink got nothing."""
    [deferred, *_] = events_of(done, "deferred")
    assert deferred["policy"] == "dane" and deferred["reason"] == "tls_policy"
    assert "no TLSA record matches" in deferred["response"]
    assert sink.messages == []


def _verified_under_dane(done: dict[str, Any]) -> None:
    [delivered] = events_of(done, "delivered")
    assert delivered["policy"] == "dane" and delivered["tls"]["verified"] is True


@one_engine
async def test_dane_ee_match_delivers_with_policy_dane_and_no_name_check(
    loopback: Loopback,
) -> None:
    # The certificate names neither the MX host nor anything else the client knows.
    sink, chain = await dane_sink(loopback, loopback.tls_ca.ca, "somewhere.else.example")
    publish_tlsa(loopback, sink, f"3 1 1 {spki_sha256(chain[0])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        _verified_under_dane(done)
        assert [m.tls for m in sink.messages] == [True]
        counts = await tls_counts(service)
        assert counts[("dane", "verified")] == 1


@one_engine
async def test_dane_ee_mismatch_defers_and_never_sends_in_plain_text(
    loopback: Loopback,
) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)  # valid for the name: no matter
    publish_tlsa(loopback, sink, f"3 1 1 {'00' * 32}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", was_deferred)
        _refused_under_dane(done, sink)
        assert not any(line.startswith("MAIL") for line in sink.transcript)


@one_engine
async def test_tls_required_no_delivers_where_no_tlsa_record_matches(loopback: Loopback) -> None:
    """RFC 8689 5 under DANE as under MTA-STS: a message with `TLS-Required: No` that no
    TLSA-matching host can take goes with opportunistic TLS; one without it waits."""
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    publish_tlsa(loopback, sink, f"3 1 1 {'00' * 32}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        first = await send_until(account, f"ann@{DOMAIN}", was_deferred)
        assert events_of(first, "deferred")[0]["policy"] == "dane"
        await delivered_without_policy(account, sink, f"bob@{DOMAIN}")
        waiting = (await account.client.get(f"/v1/emails/{first['id']}")).json()
        assert waiting["status"] != "delivered" and not events_of(waiting, "delivered")


@one_engine
async def test_dane_ta_match_checks_the_chain_and_the_mx_name(loopback: Loopback) -> None:
    intermediate = loopback.tls_ca.ca.create_child_ca()
    sink, chain = await dane_sink(loopback, intermediate, MX)
    assert len(chain) == 2  # the sink presents its intermediate, the trust anchor
    publish_tlsa(loopback, sink, f"2 1 1 {spki_sha256(chain[1])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        _verified_under_dane(done)


def test_dane_ta_refuses_a_leaf_for_another_name_and_pkix_usages_are_unusable() -> None:
    ca = trustme.CA()
    intermediate = ca.create_child_ca()
    pems = [blob.bytes() for blob in intermediate.issue_cert("other.example").cert_chain_pems]
    chain = [x509.load_pem_x509_certificate(p).public_bytes(Encoding.DER) for p in pems]
    anchor = dane.Tlsa(2, 1, 1, bytes.fromhex(spki_sha256(pems[1])))
    now = datetime.now(UTC)
    assert dane.check([anchor], chain, "other.example", now) is None
    problem = dane.check([anchor], chain, MX, now)
    assert problem is not None and "subjectAltName" in problem
    full = dane.Tlsa(3, 0, 0, chain[0])  # the whole leaf, exact
    assert dane.check([full], chain, MX, now) is None
    pkix = [(0, 1, 1, anchor.data), (1, 0, 0, chain[0]), (3, 2, 1, b""), (2, 1, 9, b"")]
    assert dane.usable(pkix) == ()  # RFC 7672 3.1.3, and unknown selectors and types


def _without_mx(loopback: Loopback, sink: SmtpSink, tlsa: str, *, secure: bool = True) -> None:
    """The domain publishes no MX record, only its own address, and a TLSA record at itself;
    its answers (the MX denial, the addresses) and the TLSA answer authenticated if `secure`."""
    loopback.dns.set(DOMAIN, "A", ["127.0.0.1"])
    name = f"_{sink.port}._tcp.{DOMAIN}"
    loopback.dns.set(name, "TLSA", [tlsa])
    if secure:
        loopback.dns.secure(DOMAIN, name)


@one_engine
async def test_a_domain_without_mx_records_is_its_own_tlsa_base_domain(
    loopback: Loopback,
) -> None:
    # RFC 7672 2.2.2: mail goes to the domain's own address, and its TLSA records bind it.
    sink, chain = await dane_sink(loopback, loopback.tls_ca.ca, "somewhere.else.example")
    _without_mx(loopback, sink, f"3 1 1 {'00' * 32}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", was_deferred)
        _refused_under_dane(done, sink)
        _without_mx(loopback, sink, f"3 1 1 {spki_sha256(chain[0])}")
        done = await send_until(account, f"bob@{DOMAIN}", is_delivered)
        _verified_under_dane(done)


@one_engine
async def test_a_domain_without_mx_records_and_unauthenticated_answers_has_no_dane(
    loopback: Loopback,
) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, DOMAIN)
    _without_mx(loopback, sink, f"3 1 1 {'00' * 32}", secure=False)
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        [delivered] = events_of(done, "delivered")
        assert delivered["policy"] == "opportunistic"


@one_engine
async def test_without_the_ad_bit_delivery_is_opportunistic(loopback: Loopback) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    publish_tlsa(loopback, sink, f"3 1 1 {'00' * 32}", secure=False)  # would not match
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        [delivered] = events_of(done, "delivered")
        assert delivered["policy"] == "opportunistic"
        assert delivered["tls"]["verified"] is False


@one_engine
async def test_with_dnssec_off_nothing_is_asked_and_delivery_is_opportunistic(
    loopback: Loopback,
) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    name = publish_tlsa(loopback, sink, f"3 1 1 {'00' * 32}")  # secure, and would not match
    async with _service(loopback, sink, dnssec="off") as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        [delivered] = events_of(done, "delivered")
        assert delivered["policy"] == "opportunistic"
        assert not [q for q in loopback.dns.queries if q.name == name]


@one_engine
async def test_a_failed_tlsa_lookup_for_a_secure_mx_defers(loopback: Loopback) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    name = publish_tlsa(loopback, sink, f"3 1 1 {'00' * 32}")
    loopback.dns.fail(name)
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", was_deferred)
        [deferred, *_] = events_of(done, "deferred")
        assert deferred["policy"] == "dane" and deferred["reason"] == "tls_policy"
        assert "TLSA lookup" in deferred["response"]
        assert sink.messages == []


@one_engine
async def test_dane_wins_over_an_mta_sts_policy(loopback: Loopback) -> None:
    sink, chain = await dane_sink(loopback, loopback.tls_ca.ca, "localhost")
    # MTA-STS enforce lists another host and the certificate fails its name check: under
    # MTA-STS alone the mail would wait. DANE covers the host and matches.
    loopback.publish(DOMAIN, "1", 200, sts_policy("enforce", "mx.elsewhere.example"))
    publish_tlsa(loopback, sink, f"3 1 1 {spki_sha256(chain[0])}")
    async with _service(loopback, sink) as service:
        account = await ready_account(service, loopback.dns)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        _verified_under_dane(done)
