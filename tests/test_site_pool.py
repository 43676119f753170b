"""Connections per egress source and MX host (issue 32, item 2), on both engines: two
recipient domains behind one MX host share a connection, which ends with QUIT once idle; a
pooled connection goes only to mail of its own source and TLS posture; and a round with more
egress sources than connections never has more connections open than it may."""

from __future__ import annotations

from collections import Counter
from datetime import timedelta

import trio
import trio.testing
from trio.testing import MockClock

from engine.delivery.egress import Source
from engine.delivery.site_pool import KEEP_IDLE, Posture, SitePool
from engine.smtp.session import connect
from tests.harness.clock import minute_after, move_to, now
from tests.harness.dns_server import DnsServer
from tests.harness.egress import assign_pool, create_pool, create_source
from tests.harness.policies import create_policy
from tests.harness.sending import message, ready_account, schedule, wait_for_status
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink


async def test_two_domains_behind_one_mx_host_share_a_connection_that_ends_when_idle(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    dns_server.set("mx.shared.test", "A", ["127.0.0.1"])
    for domain in ("one.example", "two.example"):
        dns_server.set(domain, "MX", ["10 mx.shared.test."])
    for n, to in enumerate(("a@one.example", "b@two.example"), start=1):
        sent = await account.client.post("/v1/emails/", json=message(to))
        assert sent.status_code == 202, sent.text
        await smtp_sink.wait_for_messages(n)
        await service.settled()  # its outcome written: the connection is back in the pool
    # The second domain's mail went over the first one's connection: one EHLO, one QUIT.
    assert smtp_sink.connections == 1
    assert smtp_sink.open_connections == 1  # idle, kept for another round
    clock.jump(KEEP_IDLE)
    await service.settled()
    assert smtp_sink.transcript[-1] == "QUIT"
    assert smtp_sink.open_connections == 0


async def test_a_pooled_connection_the_server_dropped_is_replaced_not_a_failure(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    dns_server.set("mx.shared.test", "A", ["127.0.0.1"])
    for domain in ("one.example", "two.example"):
        dns_server.set(domain, "MX", ["10 mx.shared.test."])
    first = await account.client.post("/v1/emails/", json=message("a@one.example"))
    await smtp_sink.wait_for_messages(1)
    await service.settled()
    smtp_sink.hang_up()  # the idle connection in the pool is gone, unknown to the sender
    second = await account.client.post("/v1/emails/", json=message("b@two.example"))
    await smtp_sink.wait_for_messages(2)
    for sent in (first, second):
        assert (await wait_for_status(account, sent.json()["id"]))["status"] == "delivered"
    assert smtp_sink.connections == 2


async def test_a_pooled_connection_goes_only_to_its_own_source_and_tls_posture(
    smtp_sink: SmtpSink, nursery: trio.Nursery, clock: MockClock
) -> None:
    sites = SitePool()
    nursery.start_soon(sites.run)
    source = Source("out.example.org")
    session = await connect(
        "127.0.0.1", smtp_sink.port, helo_name="out.example.org", tls=None, mx_host="mx.test"
    )
    sites.put(source, session, uses=3)
    plain = Posture("none", False)
    assert sites.take(Source("other.example.org"), [("mx.test", plain)]) is None
    assert sites.take(source, [("mx.test", Posture("mta-sts", True))]) is None
    assert sites.take(source, [("mx2.test", plain)]) is None
    assert sites.take(source, [("mx2.test", plain), ("mx.test", plain)]) == (session, 3)
    assert sites.take(source, [("mx.test", plain)]) is None  # taken: it is no longer idle
    sites.put(source, session, uses=4)
    await trio.testing.wait_all_tasks_blocked(0.05)
    assert len(sites) == 1 and smtp_sink.open_connections == 1
    clock.jump(KEEP_IDLE)
    await trio.testing.wait_all_tasks_blocked(0.05)
    assert len(sites) == 0
    assert smtp_sink.transcript[-1] == "QUIT" and smtp_sink.open_connections == 0


async def test_more_sources_than_connections_take_turns_on_the_one_connection(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    admin = await service.account(admin=True)
    dns_server.set("narrow.example", "MX", ["10 mx.narrow.example."])
    dns_server.set("mx.narrow.example", "A", ["127.0.0.1"])
    await create_policy(account, match="narrow.example", max_connections=1)
    sources = [await create_source(admin, f"s{n}", f"127.0.0.{n}") for n in (2, 3, 4)]
    pool_id = await create_pool(admin, "three", *((s, 1) for s in sources))
    await assign_pool(admin, "workspace", account.workspace_id, pool_id)
    send_at = now(service) + timedelta(hours=1)
    await schedule(account, [f"r{i}@narrow.example" for i in range(30)], send_at)
    move_to(service, clock, minute_after(send_at))
    received = await smtp_sink.wait_for_messages(30, timeout=60)
    # Every source had its turn, one connection at a time.
    assert set(Counter(m.peer for m in received)) == {"127.0.0.2", "127.0.0.3", "127.0.0.4"}
    assert smtp_sink.most_open_connections == 1
