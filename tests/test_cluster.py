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
"""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path
from typing import Any

import trio

from engine.delivery.domain_queue import CONNECTIONS
from engine.nodes import DEAD_AFTER
from tests.harness.cluster import (
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
