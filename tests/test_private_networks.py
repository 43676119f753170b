"""Private networks stay unreachable from tenant-chosen targets (issue 14, part 2).

With POSTROOM_ALLOW_PRIVATE_TARGETS off, no webhook or forward URL, no recipient's MX host and
no address probed by `/v1/verify` reaches loopback, private, link-local or reserved space,
including IPv4 addresses carried inside IPv6 ones.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import trio
from trio.testing import MockClock

from engine.platform.private_networks import is_public
from postroom.service import RunningService, serve
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail, wait_for_email
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

# Accepted before as public: each carries a loopback, link-local or private IPv4 address.
EMBEDDING_PRIVATE_IPV4 = [
    "::127.0.0.1",  # IPv4-compatible
    "::ffff:127.0.0.1",  # IPv4-mapped
    "::ffff:10.1.2.3",
    "64:ff9b::7f00:1",  # NAT64 of 127.0.0.1
    "64:ff9b::a9fe:a9fe",  # NAT64 of 169.254.169.254, the cloud metadata service
    "64:ff9b:1::a00:1",  # local-use NAT64 (RFC 8215)
    "2002:7f00:1::",  # 6to4 of 127.0.0.1
    "2002:a9fe:a9fe::1",  # 6to4 of 169.254.169.254
    "2001:0:4136:e378:8000:63bf:80ff:fffe",  # Teredo, client 127.0.0.1 (obfuscated)
]
OTHER_PRIVATE = [
    "127.0.0.1",
    "10.0.0.1",
    "169.254.169.254",
    "100.64.0.1",
    "::1",
    "fe80::1",
    "fc00::1",
]
PUBLIC = ["93.184.216.34", "2606:2800:220:1::1", "64:ff9b::5db8:d822", "2002:5db8:d822::1"]


@pytest.mark.parametrize("address", EMBEDDING_PRIVATE_IPV4 + OTHER_PRIVATE)
def test_private_addresses_are_refused_however_they_are_written(address: str) -> None:
    assert not is_public(address)


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_pass_also_when_embedded(address: str) -> None:
    assert is_public(address)


@pytest.fixture
async def strict_service(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: MockClock,
) -> AsyncIterator[Service]:
    """The service as operators run it: private targets off."""
    settings = harness.test_settings(
        database_url,
        dns_server,
        allow_private_targets="off",
        delivery_port=str(smtp_sink.port),
        extra_ca_file=str(tls_ca.ca_file),
    )
    running: RunningService = await nursery.start(serve, settings)
    service = Service(running, clock)
    try:
        yield service
    finally:
        await service.aclose()
        running.stop()


async def test_urls_with_private_literals_are_refused_when_saved(strict_service: Service) -> None:
    account = await strict_service.account()
    for address in EMBEDDING_PRIVATE_IPV4:
        url = f"https://[{address}]/hook"
        created = await account.client.post(
            "/v1/webhooks/", json={"url": url, "events": ["email.delivered"]}
        )
        assert created.status_code == 422, (url, created.text)
        assert "public address" in created.json()["detail"]


async def test_a_name_resolving_to_an_embedded_private_address_is_refused(
    strict_service: Service, dns_server: DnsServer
) -> None:
    account = await strict_service.account()
    dns_server.set("hooks.example.net", "AAAA", ["64:ff9b::a9fe:a9fe"])
    created = await account.client.post(
        "/v1/webhooks/",
        json={"url": "https://hooks.example.net/hook", "events": ["email.delivered"]},
    )
    assert created.status_code == 422
    assert "public address" in created.json()["detail"]


async def test_mail_for_a_domain_whose_mx_is_private_is_never_connected(
    strict_service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(strict_service, dns_server)
    route_mail(dns_server, "inside.example")  # its MX host resolves to 127.0.0.1
    sent = (await account.client.post("/v1/emails/", json=message("ops@inside.example"))).json()
    email = await wait_for_email(account, sent["id"], lambda e: e["status"] == "deferred")
    [recipient] = email["recipients"]
    assert "private or reserved addresses" in recipient["last_response"]
    assert smtp_sink.connections == 0
    suppressed = await account.client.get("/v1/suppressions/")
    assert suppressed.json()["items"] == []  # our own rule is never the recipient's fault


async def test_verify_never_probes_a_private_mx(
    strict_service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await strict_service.account()
    route_mail(dns_server, "inside.example")
    checked = await account.client.post("/v1/verify", json={"email": "ops@inside.example"})
    assert checked.status_code == 200
    assert checked.json()["result"] == "unknown"
    assert "private or reserved" in checked.json()["reason"]
    assert smtp_sink.connections == 0
