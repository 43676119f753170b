"""The plan's monthly volume across nodes: each node counts in a shard of its own, and two
nodes with room left for one email must not send one each (PostgreSQL: SQLite's nodes share
one writer, which takes turns)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio

from engine import plans
from tests.harness.cluster import SENDER, database_rows, prepare_account, running_cluster
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

RECIPIENT_DOMAIN = "volume.example"


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url)


def _sends_held(url: str) -> int:
    """Sends waiting on a lock: storing their email (its foreign key on the held row), taking
    the workspace's volume lock, or (two nodes counting in one shard, 1 in 16) the shard's
    row, which the other holds. Other units, such as activity entries, may wait on the held
    row too: they are not counted."""
    [(count,)] = database_rows(
        url,
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND (query LIKE 'INSERT INTO emails %'"
        " OR query LIKE 'INSERT INTO usage_shards %'"
        " OR query LIKE '%FROM workspaces % FOR NO KEY UPDATE')",
    )
    return int(str(count))


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_two_nodes_with_room_for_one_email_send_one(
    database_url: str, tmp_path: Path, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    """One email is left of the Starter plan's month; a send reaches each of two nodes at once,
    both held (by a lock on the workspace's row) after the point where a node reads the
    volume and before it stores: one is accepted, the other refused with 403 `plan_limit`."""
    limit = plans.plan("starter").emails_per_month
    with running_cluster(
        2, database_url, tmp_path, dns_nameserver=dns_server.nameserver,
        delivery_port=smtp_sink.port,
    ) as cluster:  # fmt: skip
        key = await prepare_account(cluster, dns_server, [RECIPIENT_DOMAIN], None, "starter")
        [(workspace_id,)] = database_rows(database_url, "SELECT id FROM workspaces")
        [(this_month,)] = database_rows(
            database_url, "SELECT to_char(now() AT TIME ZONE 'UTC', 'YYYY-MM')"
        )
        held = await trio.to_thread.run_sync(_connect, database_url)
        try:
            held.execute(
                "INSERT INTO usage_shards (workspace_id, month, shard, emails)"
                " VALUES (%s, %s, 15, %s)",
                (workspace_id, this_month, limit - 1),
            )
            held.commit()
            held.execute("SELECT 1 FROM workspaces WHERE id = %s FOR UPDATE", (workspace_id,))
            answers: list[httpx.Response] = []

            async def send(node_url: str, n: int) -> None:
                body = {
                    "from_": {"email": SENDER},
                    "to": [{"email": f"r{n}@{RECIPIENT_DOMAIN}"}],
                    "subject": "The last one",
                    "text": "Hello.",
                }
                async with httpx.AsyncClient(
                    base_url=node_url, headers={"Authorization": f"Bearer {key}"}, timeout=60
                ) as client:
                    answers.append(await client.post("/v1/emails/", json=body))

            async with trio.open_nursery() as nursery:
                for n, node in enumerate(cluster.nodes):
                    nursery.start_soon(send, node.url, n)
                with trio.fail_after(20):  # both sends wait on the lock
                    while await trio.to_thread.run_sync(_sends_held, database_url) < 2:  # noqa: ASYNC110
                        await trio.sleep(0.05)
                await trio.to_thread.run_sync(held.commit)
        finally:
            await trio.to_thread.run_sync(held.close)
    statuses = sorted(answer.status_code for answer in answers)
    assert statuses == [202, 403], [answer.text for answer in answers]
    refused = next(answer for answer in answers if answer.status_code == 403)
    assert refused.json()["code"] == "plan_limit"
