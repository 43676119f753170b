"""Sites steered between delivering nodes (issue 32: a second MX site must not lower the rate
to the first), on both engines: two nodes on one database deliver to the sink through real
SMTP, and which node sends to a destination is read from the connection slots it holds.

A node's event loop bounds its delivery rate, and a node takes all of a destination's slots,
so two sites sent from one node share one loop while another node idles. A node starting a
destination while it sends to more destinations than another delivering node leaves it to
that node for one claim, and takes it itself after that if nobody has.
"""

from __future__ import annotations

from datetime import datetime, timedelta

import httpx
import trio

from engine.delivery import throttle
from engine.platform.nodes import LEASE
from engine.platform.settings import Caps
from postroom.service import RunningService, serve
from storage import destination_slots, nodes
from storage.codec import timestamp
from storage.tx import Tx
from tests.harness import service as harness
from tests.harness.clock import now
from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail, schedule, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

FIRST, SECOND = "first.example", "second.example"
EACH = 4  # emails to each site
SLOW = 5.0  # seconds the sink waits before answering a message: its site's slots stay held


def _holders_of(tx: Tx, destination: str, at: datetime) -> set[str]:
    rows = tx.all(
        "SELECT DISTINCT held_by FROM destination_slots WHERE destination = :d"
        " AND held_by IS NOT NULL AND lease_until >= :now",
        {"d": destination, "now": timestamp(at)},
    )
    return {row["held_by"] for row in rows}


async def _sending_to(service: Service, destination: str) -> str:
    """The one node holding the destination's slots, once one does."""
    with trio.fail_after(15):
        while True:
            held = await service.running.runtime.db.read(_holders_of, destination, now(service))
            if held:
                [node] = held
                return node
            await trio.sleep(0.02)


async def _send(client: httpx.AsyncClient, domain: str) -> list[str]:
    batch = [message(f"r{i}@{domain}") for i in range(EACH)]
    response = await client.post("/v1/emails/batch", json=batch)
    assert response.status_code == 202, response.text
    return [item["id"] for item in response.json()]


async def _delivered(account: Account, ids: list[str]) -> None:
    for email_id in ids:
        assert (await wait_for_status(account, email_id))["status"] == "delivered"


async def test_a_second_site_goes_to_the_node_not_sending_to_the_first(
    service: Service,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    nursery: trio.Nursery,
) -> None:
    settings = harness.test_settings(database_url, dns_server, delivery_port=str(smtp_sink.port))
    second: RunningService = await nursery.start(serve, settings)
    try:
        account = await ready_account(service, dns_server)
        route_mail(dns_server, FIRST)
        route_mail(dns_server, SECOND)
        smtp_sink.data_delay = SLOW
        headers = {"Authorization": f"Bearer {account.api_key}"}
        async with httpx.AsyncClient(base_url=second.api_url, headers=headers) as other:
            clients = {service.running.runtime.node: account.client, second.runtime.node: other}
            first_ids = await _send(account.client, FIRST)
            busy = await _sending_to(service, FIRST)
            # The second site's mail, accepted by the node already sending to the first (it
            # hears of it before any other node does), goes out through the other node.
            second_ids = await _send(clients[busy], SECOND)
            assert await _sending_to(service, SECOND) != busy
        await _delivered(account, first_ids + second_ids)
        assert len(smtp_sink.messages) == 2 * EACH
    finally:
        second.stop()


async def test_a_site_left_to_a_node_that_does_not_take_it_is_sent_after_one_claim(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    # Another delivering node is alive on the database and sends to nothing, but never
    # claims: stalled, or its delivery stopped. The one node working leaves it the second
    # site once, then takes the site itself.
    await service.running.runtime.db.write(
        nodes.register, "stalled-node", "elsewhere", 1, "delivery", None, now(service)
    )
    account = await ready_account(service, dns_server)
    route_mail(dns_server, FIRST)
    route_mail(dns_server, SECOND)
    smtp_sink.data_delay = SLOW
    first_ids = await _send(account.client, FIRST)
    node = await _sending_to(service, FIRST)
    second_ids = await _send(account.client, SECOND)
    # One claim later (a second), while the first site's mail is still out, and long before
    # the stalled node is found dead (DEAD_AFTER: 15 s) and the second site is no longer left.
    with trio.fail_after(SLOW - 1):
        assert await _sending_to(service, SECOND) == node
    await _delivered(account, first_ids + second_ids)


async def test_a_node_keeps_a_site_it_sends_to_and_leaves_one_new_to_it(
    service: Service, dns_server: DnsServer
) -> None:
    # The claim itself, for a node sending to a third site and to the first (a round of its
    # holds a slot there while it is built), beside nodes sending to nothing: its next round
    # for the first site is claimed (its queue holds no slot yet: the round holds them), and
    # the second site, new to it, is left to them.
    account = await ready_account(service, dns_server)
    send_at = now(service) + timedelta(hours=1)
    await schedule(account, [f"r@{FIRST}", f"r@{SECOND}"], send_at)
    when = send_at + timedelta(seconds=5)

    def sending(tx: Tx) -> None:
        nodes.register(tx, "node-a", "elsewhere", 1, "delivery", None, when)
        for site in ("third.example", FIRST):
            destination_slots.acquire(tx, site, 10, 1, "node-a", when, when + LEASE)

    db = service.running.runtime.db
    await db.write(sending)

    async def claim(domain: str) -> throttle.Claimed:
        destination = throttle.Destination(domain, (f"mx.{domain}",))
        return await db.write(
            throttle.claim, destination, None, 10, 0, "node-a", when, when + LEASE, 200, Caps(),
            True,
        )  # fmt: skip

    kept = await claim(FIRST)
    assert [r.address for r in kept.recipients] == [f"r@{FIRST}"] and not kept.yielded
    left = await claim(SECOND)
    assert left.yielded and not left.recipients
