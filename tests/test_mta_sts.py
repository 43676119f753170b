"""MTA-STS on the way out (RFC 8461, issue 31): the policy fetched over verified HTTPS from a
real policy server on loopback, cached in the database, and what `enforce` and `testing` do
with a real SMTP sink whose certificate does or does not match the MX name."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any

import pytest
import trio
import trio.testing
from prometheus_client.parser import text_string_to_metric_families

from engine.delivery import mta_sts
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail, wait_for_email
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

DOMAIN = "customer.example"
POLICY_PATH = "/.well-known/mta-sts.txt"


def _policy(mode: str, *mx: str, max_age: int = 86400) -> str:
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
class _Loopback:
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
) -> _Loopback:
    return _Loopback(nursery, database_url, dns_server, policy_server, tls_ca, clock)


def _delivered(email: dict[str, Any]) -> bool:
    return bool(email["status"] == "delivered")


def _deferred(email: dict[str, Any]) -> bool:
    return bool(_events(email, "deferred"))


async def _send(account: Account, to: str, until: Callable[[dict[str, Any]], bool]) -> Any:
    """Send one email to `to` and wait until `until` says so of it; its detail."""
    sent = await account.client.post("/v1/emails/", json=message(to))
    return await wait_for_email(account, sent.json()["id"], until)


def _events(email: dict[str, Any], kind: str) -> list[dict[str, Any]]:
    return [e["metadata"] for e in email["events"] if e["event_type"] == kind]


async def _tls_counts(service: Service) -> dict[tuple[str, str], float]:
    response = await service.client().get("/metrics")
    [family] = [
        f
        for f in text_string_to_metric_families(response.text)
        if f.name == "postroom_deliveries_tls"
    ]
    return {(s.labels["policy"], s.labels["tls"]): s.value for s in family.samples}


async def test_enforce_delivers_over_verified_tls_and_fetches_the_policy_once(
    loopback: _Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink(f"mx.{DOMAIN}")
    loopback.publish(DOMAIN, "20261126", 200, _policy("enforce", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        delivered = []
        for n in range(3):  # one after the other: each a round of its own, the cache shared
            done = await _send(account, f"u{n}@{DOMAIN}", _delivered)
            delivered += _events(done, "delivered")
        assert len(sink.messages) == 3 and all(m.tls for m in sink.messages)
        for event in delivered:
            assert event["policy"] == "mta-sts"
            assert event["mx_host"] == f"mx.{DOMAIN}"
            assert event["tls"]["verified"] is True
        [fetch] = policy_server.requests  # one fetch for every delivery
        assert fetch.method == "GET" and fetch.path == POLICY_PATH
        assert fetch.headers["host"] == f"mta-sts.{DOMAIN}:{policy_server.port}"
        counts = await _tls_counts(service)
        assert counts[("mta-sts", "verified")] == 3
        assert counts[("opportunistic", "encrypted")] == 0


async def test_enforce_defers_for_a_wrong_certificate_or_an_unlisted_mx_never_in_plain_text(
    loopback: _Loopback,
) -> None:
    dns_server = loopback.dns
    # The sink's certificate names the loopback addresses, not the MX host.
    sink = await loopback.sink("localhost", "127.0.0.1")
    # One policy for both: it lists only mx.customer.example.
    listing = _policy("enforce", f"mx.{DOMAIN}", "*.elsewhere.example")
    for domain in (DOMAIN, "unlisted.example"):
        loopback.publish(domain, "1", 200, listing)
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        reasons = {}
        for domain in (DOMAIN, "unlisted.example"):
            done = await _send(account, f"ann@{domain}", _deferred)
            [deferred, *_] = _events(done, "deferred")
            assert deferred["policy"] == "mta-sts" and deferred["reason"] == "tls_policy"
            reasons[domain] = deferred["response"]
        assert "certificate verify failed" in reasons[DOMAIN]
        assert "mx.unlisted.example is not listed" in reasons["unlisted.example"]
        assert sink.messages == []  # never fell back to plain text
        assert not any(line.startswith("MAIL") for line in sink.transcript)


async def test_testing_delivers_and_records_and_a_new_id_is_fetched_and_enforced(
    loopback: _Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink()  # offers no STARTTLS
    loopback.publish(DOMAIN, "a1", 200, _policy("testing", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        done = await _send(account, f"ann@{DOMAIN}", _delivered)
        [delivered] = _events(done, "delivered")
        assert delivered["policy"] == "mta-sts" and delivered["tls"] is None
        assert (await _tls_counts(service))[("mta-sts", "plaintext")] == 1

        # The domain publishes a new id: the policy is fetched again, and now it enforces.
        dns_server.set(f"_mta-sts.{DOMAIN}", "TXT", ["v=STSv1; id=b2"])
        policy_server.respond(200, _policy("enforce", f"mx.{DOMAIN}"))
        done = await _send(account, f"bob@{DOMAIN}", _deferred)
        [deferred, *_] = _events(done, "deferred")
        assert deferred["reason"] == "tls_policy" and "did not start TLS" in deferred["response"]
        assert len(policy_server.requests) == 2 and len(sink.messages) == 1


async def test_a_failed_fetch_is_no_policy_and_is_not_tried_again_at_once(
    loopback: _Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink(f"mx.{DOMAIN}")
    loopback.publish(DOMAIN, "1", 404, "no policy here")
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        for n in range(2):
            done = await _send(account, f"u{n}@{DOMAIN}", _delivered)
            [delivered] = _events(done, "delivered")
            assert delivered["policy"] == "opportunistic"
            assert delivered["tls"]["verified"] is False
        assert len(policy_server.requests) == 1  # the next try waits for FETCH_AGAIN


def test_policy_records_and_files_are_read_as_rfc_8461_says() -> None:
    assert mta_sts.txt_id(["v=STSv1; id=20160831085700Z;"]) == "20160831085700Z"
    assert mta_sts.txt_id(["v=STSv1; id=a", "v=STSv1; id=b"]) is None  # two: none usable
    assert mta_sts.txt_id(["v=spf1 -all"]) is None
    assert mta_sts.txt_id(["v=STSv1; id=not-alnum"]) is None
    mode, mx, age = mta_sts.parse(
        _policy("enforce", "mail.example.com", "*.example.net", max_age=10**9)
    )
    assert (mode, mx, age) == ("enforce", ("mail.example.com", "*.example.net"), 31_557_600)
    policy = mta_sts.Policy("example.com", "1", mode, mx)
    assert policy.allows("MAIL.example.com.") and policy.allows("a.example.net")
    assert not policy.allows("a.b.example.net") and not policy.allows("example.net")
    for bad, why in [
        ("version: STSv2\nmode: enforce\nmx: a.example\nmax_age: 1\n", "version"),
        ("version: STSv1\nmode: strict\nmx: a.example\nmax_age: 1\n", "mode"),
        ("version: STSv1\nmode: enforce\nmax_age: 1\n", "lists no mx"),
        ("version: STSv1\nmode: enforce\nmx: a.example\nmax_age: -1\n", "max_age"),
        ("version: STSv1\nmode: enforce\nmx: bad host!\nmax_age: 1\n", "host name pattern"),
    ]:
        with pytest.raises(ValueError, match=why):
            mta_sts.parse(bad)
