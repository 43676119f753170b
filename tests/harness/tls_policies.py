"""The TLS policies of delivery as tests meet them (MTA-STS, DANE): the peers on loopback (a DNS
server, an HTTPS policy server, the test CA) and a service started against them, policies and
TLSA records to publish, and what an email's events and /metrics say of its TLS.

`loopback` and `policy_server` are fixtures: a test module takes them in by assignment
(`loopback = tls_policies.loopback`), so that pytest finds them in that module.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
import trustme
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from prometheus_client.parser import text_string_to_metric_families

from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, route_mail, wait_for_email
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

DOMAIN = "customer.example"


def sts_policy(mode: str, *mx: str, max_age: int = 86400) -> str:
    lines = ["version: STSv1", f"mode: {mode}", *(f"mx: {m}" for m in mx), f"max_age: {max_age}"]
    return "\r\n".join(lines) + "\r\n"


@pytest.fixture
async def policy_server(nursery: trio.Nursery, tls_ca: TlsAuthority) -> HttpsReceiver:
    """An HTTPS server with a certificate for the policy hosts of the test domains."""
    names = [f"mta-sts.{d}" for d in (DOMAIN, "unlisted.example")]
    context = tls_ca.server_context()
    tls_ca.ca.issue_cert(*names).configure_cert(context)
    server = HttpsReceiver(context)
    await nursery.start(server.run)
    return server


@dataclass
class Loopback:
    """The peers of a test on loopback, and the service started against them."""

    nursery: trio.Nursery
    database_url: str
    dns: DnsServer
    policy_server: HttpsReceiver
    tls_ca: TlsAuthority
    clock: trio.testing.MockClock

    async def sink(self, *names: str) -> SmtpSink:
        """A sink offering STARTTLS with a certificate for `names` (none: no STARTTLS)."""
        context = None
        if names:
            context = self.tls_ca.server_context()
            self.tls_ca.ca.issue_cert(*names).configure_cert(context)
        sink = SmtpSink(context)
        await self.nursery.start(sink.run)
        return sink

    def publish(self, domain: str, policy_id: str, status: int, policy: str) -> None:
        """The domain's MX (mx.<domain>), `_mta-sts` TXT and policy host, on loopback; the
        policy server answers every fetch with `status` and `policy`."""
        route_mail(self.dns, domain)
        self.dns.set(f"_mta-sts.{domain}", "TXT", [f"v=STSv1; id={policy_id}"])
        self.dns.set(f"mta-sts.{domain}", "A", ["127.0.0.1"])
        self.policy_server.respond(status, policy)

    def service(self, sink: SmtpSink) -> AbstractAsyncContextManager[Service]:
        settings = harness.test_settings(
            self.database_url,
            self.dns,
            delivery_port=str(sink.port),
            mta_sts_port=str(self.policy_server.port),
            extra_ca_file=str(self.tls_ca.ca_file),  # trusts the policy server and the MXs
        )
        return harness.started(self.nursery, settings, self.clock)


@pytest.fixture
def loopback(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    policy_server: HttpsReceiver,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
) -> Loopback:
    return Loopback(nursery, database_url, dns_server, policy_server, tls_ca, clock)


def is_delivered(email: dict[str, Any]) -> bool:
    return bool(email["status"] == "delivered")


def was_deferred(email: dict[str, Any]) -> bool:
    return bool(events_of(email, "deferred"))


async def send_until(account: Account, to: str, until: Callable[[dict[str, Any]], bool]) -> Any:
    """Send one email to `to` and wait until `until` says so of it; its detail."""
    sent = await account.client.post("/v1/emails/", json=message(to))
    return await wait_for_email(account, sent.json()["id"], until)


async def delivered_without_policy(account: Account, sink: SmtpSink, to: str) -> bytes:
    """Send `to` a message with `TLS-Required: No` (RFC 8689 5) where the domain's TLS policy
    passes every host over: it is delivered with opportunistic TLS, unverified, and is the
    one message `sink` received; what the sink received."""
    body = message(to, headers={"TLS-Required": "No"})
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    done = await wait_for_email(account, sent["id"], is_delivered)
    [delivered] = events_of(done, "delivered")
    assert delivered["policy"] == "opportunistic" and delivered["tls"]["verified"] is False
    [received] = sink.messages
    assert received.rcpt_to == (to,) and received.tls
    return received.data


def events_of(email: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["metadata"] for e in email["events"] if e["event_type"] == kind]


async def tls_counts(service: Service) -> dict[tuple[str, str], float]:
    response = await service.client().get("/metrics")
    [family] = [
        f
        for f in text_string_to_metric_families(response.text)
        if f.name == "postroom_deliveries_tls"
    ]
    return {(s.labels["policy"], s.labels["tls"]): s.value for s in family.samples}


# DANE: a sink whose certificate a TLSA record names, and that record published.
MX = f"mx.{DOMAIN}"


def spki_sha256(pem: bytes) -> str:
    key = x509.load_pem_x509_certificate(pem).public_key()
    return hashlib.sha256(
        key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    ).hexdigest()


async def dane_sink(
    loopback: Loopback, issuer: trustme.CA, *names: str
) -> tuple[SmtpSink, list[bytes]]:
    """A sink offering STARTTLS with a certificate `issuer` made for `names`; its chain (PEM)."""
    context = loopback.tls_ca.server_context()
    leaf = issuer.issue_cert(*names)
    leaf.configure_cert(context)
    sink = SmtpSink(context)
    await loopback.nursery.start(sink.run)
    return sink, [blob.bytes() for blob in leaf.cert_chain_pems]


def publish_tlsa(loopback: Loopback, sink: SmtpSink, tlsa: str, *, secure: bool = True) -> str:
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
