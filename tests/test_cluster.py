"""Three nodes on one PostgreSQL database, two of them killed during delivery (issue 15).

A slow receiver keeps a few hundred emails in flight across three `postroom serve`
processes; one node is killed with SIGKILL, a second one a few seconds later, and the first
is started again. Asserted, as an operator would check it:
- no accepted email is lost (every Message-ID arrives);
- duplicates happen only for recipients a killed node held at the kill (the bound);
- the dead nodes' mail is being delivered by another node within 30 s of the kill;
- every delivered email's `email.delivered` webhook arrives at least once;
- the receiver never sees more than the per-destination limit of transactions at once,
  across the cluster.

Two more replay what a deploy and a stall do to two nodes delivering to a receiver that
answers each message after 0.4 s (issue 28):
- a clean stop (SIGTERM, as a deploy or a restart sends it) sends nothing twice, on both
  engines: the node drains, finishing the transactions whose data the receiver has, and the
  other node delivers the rest (a restarted process is a new node, like that one);
- a node stalled (SIGSTOP) past the time after which it is declared dead, then resumed,
  sends at most one message twice per connection it had open: the other node takes its mail
  over, and the resumed node drops what it had claimed and built.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from engine.delivery.domain_queue import CONNECTIONS
from engine.platform.nodes import DEAD_AFTER
from tests.harness.cluster import (
    Cluster,
    Node,
    arrivals,
    prepare_account,
    running_cluster,
    send_emails,
    until_arrived,
)
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

EMAILS = 240
RECIPIENT_DOMAIN = "many.example"
TAKEOVER_LIMIT = 30.0  # seconds from a kill until the dead node's mail is being delivered


async def test_killed_nodes_lose_nothing_and_are_taken_over_within_30_seconds(
    postgres_url: str,
    tmp_path: Path,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
) -> None:
    smtp_sink.data_delay = 0.1  # a slow receiver keeps deliveries in flight
    chance = random.Random(1415)
    extra = {"POSTROOM_EXTRA_CA_FILE": str(tls_ca.ca_file)}
    start = trio.to_thread.run_sync
    with running_cluster(
        3,
        postgres_url,
        tmp_path,
        dns_nameserver=dns_server.nameserver,
        delivery_port=smtp_sink.port,
        extra=extra,
    ) as cluster:
        key = await prepare_account(
            cluster, dns_server, [RECIPIENT_DOMAIN], https_receiver.url + "/events"
        )
        accepted = await send_emails(cluster, key, EMAILS, [RECIPIENT_DOMAIN])
        await smtp_sink.wait_for_messages(10, timeout=30)

        # Kill one node, then a second, each holding recipients mid-delivery.
        first, second = chance.sample(cluster.nodes, 2)
        held_at_kill: set[tuple[str, str]] = set()
        kills: list[tuple[float, set[str]]] = []
        for victim in (first, second):
            held = (await start(cluster.held_by_process)).get(victim.pid, set())
            await start(victim.kill)
            kills.append((trio.current_time(), {email_id for email_id, _ in held}))
            held_at_kill |= held
            await trio.sleep(3)
        await start(first.start)  # the first comes back later, as a new node

        wanted = set(accepted)
        await until_arrived(smtp_sink, wanted, 120)

        arrived = arrivals(smtp_sink)
        counts = Counter(mid for mid, _ in arrived)
        assert set(counts) >= wanted  # nothing accepted was lost
        duplicates = sum(n - 1 for n in counts.values())
        assert duplicates <= len(held_at_kill), (duplicates, len(held_at_kill))

        email_of = accepted
        for killed_at, held_emails in kills:
            if not held_emails:
                continue
            taken_over = [
                at for mid, at in arrived if email_of.get(mid) in held_emails and at > killed_at
            ]
            assert taken_over, "the dead node's recipients were never delivered by another"
            assert min(taken_over) - killed_at < TAKEOVER_LIMIT

        assert smtp_sink.most_open_transactions <= CONNECTIONS

        delivered_events: Counter[str] = Counter()
        with trio.fail_after(60):
            while set(delivered_events) < set(accepted.values()):
                await trio.sleep(0.2)
                delivered_events = Counter(
                    request.json()["email_id"] for request in https_receiver.requests
                )
        # The killed nodes are found dead once their beats are older than DEAD_AFTER, even
        # when all mail was delivered before that; the second victim stays dead.
        with trio.fail_after(DEAD_AFTER.total_seconds() + 30):
            while True:
                listed: Any = await start(cluster.cli, "nodes")
                if str(listed).count(" alive ") == 2:
                    break
                await trio.sleep(1)


SLOW_REPLY = 0.4  # seconds the receiver takes to answer each message's data
LOAD = 60  # emails in flight through two nodes: several seconds of delivery at SLOW_REPLY


async def _until_settled(cluster: Cluster, timeout: float) -> None:  # noqa: ASYNC109
    """Wait until every recipient is delivered and no node holds one any more."""
    with trio.fail_after(timeout):
        while True:
            if not await trio.to_thread.run_sync(cluster.unsettled):
                return
            await trio.sleep(0.2)


async def _busiest(cluster: Cluster, smtp_sink: SmtpSink) -> Node:
    """Once mail is arriving, the node holding the most recipients."""
    await smtp_sink.wait_for_messages(6, timeout=60)
    held = await trio.to_thread.run_sync(cluster.held_by_process)
    return max(cluster.nodes, key=lambda node: len(held.get(node.pid, ())))


def _duplicates(smtp_sink: SmtpSink) -> int:
    counts = Counter(mid for mid, _ in arrivals(smtp_sink))
    return sum(n - 1 for n in counts.values())


async def test_a_clean_stop_under_load_sends_nothing_twice(
    database_url: str, tmp_path: Path, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    smtp_sink.data_delay = SLOW_REPLY
    with running_cluster(
        2, database_url, tmp_path, dns_nameserver=dns_server.nameserver,
        delivery_port=smtp_sink.port,
    ) as cluster:  # fmt: skip
        key = await prepare_account(cluster, dns_server, [RECIPIENT_DOMAIN], None)
        accepted = await send_emails(cluster, key, LOAD, [RECIPIENT_DOMAIN])
        victim = await _busiest(cluster, smtp_sink)
        began = time.monotonic()
        await trio.to_thread.run_sync(victim.stop)  # SIGTERM, as a deploy sends it
        stopped_in = time.monotonic() - began
        await until_arrived(smtp_sink, set(accepted), 120)
        await _until_settled(cluster, 60)
        assert _duplicates(smtp_sink) == 0
        # It waited for the transactions under way, not for the 30 s drain bound.
        assert stopped_in < 15, stopped_in


async def test_a_node_stalled_past_its_death_sends_at_most_one_twice_per_connection(
    postgres_url: str, tmp_path: Path, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    smtp_sink.data_delay = SLOW_REPLY
    with running_cluster(
        2, postgres_url, tmp_path, dns_nameserver=dns_server.nameserver,
        delivery_port=smtp_sink.port,
    ) as cluster:  # fmt: skip
        key = await prepare_account(cluster, dns_server, [RECIPIENT_DOMAIN], None)
        accepted = await send_emails(cluster, key, LOAD, [RECIPIENT_DOMAIN])
        victim = await _busiest(cluster, smtp_sink)
        victim.pause()
        try:
            # Past the time after which the other node declares it dead and takes its mail.
            await trio.sleep(DEAD_AFTER.total_seconds() + 5)
        finally:
            victim.resume()
        await until_arrived(smtp_sink, set(accepted), 120)
        await _until_settled(cluster, 60)
        # At most the transaction each of its connections (CONNECTIONS per destination) had
        # under way at the stall, or had finished without writing its outcome yet.
        duplicates = _duplicates(smtp_sink)
        assert duplicates <= CONNECTIONS, duplicates
