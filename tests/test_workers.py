"""`postroom serve --workers N`: processes sharing the ports, each a node of its own.

Through the real command: the workers answer on the same API port, each registers as a node
in its role (by default half deliver what the others take), mail accepted through them is
delivered once and counted once by `/metrics` whichever worker is scraped, a killed worker is
started again, and SIGTERM stops them all cleanly. And the nodes as platform admins list them.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from functools import partial

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from postroom import workers
from tests.harness.api import assert_error
from tests.harness.cluster import database_rows
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, SENDING_DOMAIN, route_mail
from tests.harness.service import Service, ServiceProcess
from tests.harness.smtp_sink import SmtpSink


def _nodes(proc: ServiceProcess) -> list[list[str]]:
    """The rows of `postroom nodes`: [id, role, state, ...] each."""
    lines = proc.cli("nodes").stdout.splitlines()[1:]
    return [line.split() for line in lines]


def _alive(proc: ServiceProcess) -> list[str]:
    """The ids of the alive nodes, straight from the database: tests poll this, and a
    `postroom nodes` process a time took a second or more of a loaded machine."""
    query = "SELECT id FROM nodes WHERE state = 'alive'"
    return [str(row[0]) for row in database_rows(proc.env["POSTROOM_DATABASE_URL"], query)]


async def _workers_alive(proc: ServiceProcess, count: int) -> list[str]:
    """The alive nodes once there are `count` of them (30 s at most)."""
    with trio.fail_after(30):
        while True:
            alive = await trio.to_thread.run_sync(_alive, proc)
            if len(alive) == count:
                return alive
            await trio.sleep(0.2)


async def _metrics_count_all(url: str, *, sent: int) -> None:
    """Every scrape, whichever worker answers, counts all `sent` accepts and deliveries
    (within a few heartbeats)."""
    wanted = {
        ("postroom_deliveries_total", (("outcome", "delivered"),)): sent,
        ("postroom_api_accept_seconds_count", (("endpoint", "send"),)): sent,
    }
    async with httpx.AsyncClient(limits=httpx.Limits(max_keepalive_connections=0)) as client:
        with trio.fail_after(20):
            agreeing = 0
            while agreeing < 4:  # several scrapes, so both workers are likely asked
                response = await client.get(url + "/metrics")
                found = {
                    (sample.name, tuple(sorted(sample.labels.items()))): sample.value
                    for family in text_string_to_metric_families(response.text)
                    for sample in family.samples
                }
                seen = {key: found.get(key) for key in wanted}
                agreeing = agreeing + 1 if seen == wanted else 0
                await trio.sleep(0.2)


async def _ready(proc: ServiceProcess, dns_server: DnsServer) -> str:
    created = json.loads(
        proc.cli(
            "accounts", "create", "--email", "w@example.org", "--password", "x" * 16,
            "--plan", "business",
        ).stdout
    )  # fmt: skip
    key = str(created["api_key"])
    async with httpx.AsyncClient(
        base_url=proc.url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        domain = (await client.post("/v1/domains/", json={"name": SENDING_DOMAIN})).json()
        dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
        dns_server.set(dkim["host"], "TXT", [dkim["value"]])
        assert (await client.post(f"/v1/domains/{domain['id']}/verify")).status_code == 200
        assert (await client.post("/v1/senders/", json={"email": SENDER})).status_code == 201
    return key


@pytest.mark.parametrize(
    ("options", "roles"),
    [((), ["delivery", "intake"]), (("--delivery-workers", "0"), ["all", "all"])],
    ids=["intake-and-delivery", "every-worker-both"],
)
async def test_workers_share_the_ports_deliver_once_and_stop_together(
    service_process: ServiceProcess,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    options: tuple[str, ...],
    roles: list[str],
) -> None:
    service_process.env["POSTROOM_DNS_SERVERS"] = dns_server.nameserver
    service_process.env["POSTROOM_DELIVERY_PORT"] = str(smtp_sink.port)
    service_process.workers = 2
    service_process.serve_options = options
    await trio.to_thread.run_sync(service_process.start)
    await _workers_alive(service_process, 2)
    listed = await trio.to_thread.run_sync(_nodes, service_process)
    assert sorted(row[1] for row in listed) == roles
    key = await _ready(service_process, dns_server)
    route_mail(dns_server, "workers.example")
    sent = set()
    async with httpx.AsyncClient(
        base_url=service_process.url,
        headers={"Authorization": f"Bearer {key}"},
        # A connection per request, so the kernel spreads them between the workers.
        limits=httpx.Limits(max_keepalive_connections=0),
        timeout=30,
    ) as client:
        for i in range(30):
            body = {
                "from_": {"email": SENDER},
                "to": [{"email": f"r{i}@workers.example"}],
                "subject": f"n{i}",
                "text": "hi",
            }
            response = await client.post("/v1/emails/", json=body)
            assert response.status_code == 202, response.text
            sent.add(response.json()["message_id"])
    messages = await smtp_sink.wait_for_messages(30, timeout=60)
    assert len(messages) == 30  # each once, whichever worker took it
    # A scrape reaches one worker, and delivery workers have no port: it adds up every
    # worker's figures, each as of its last heartbeat.
    await _metrics_count_all(service_process.url, sent=30)
    assert service_process.signal(signal.SIGTERM) == 0
    states = {row[2] for row in await trio.to_thread.run_sync(_nodes, service_process)}
    assert states == {"stopped"}


async def test_a_killed_worker_is_started_again(service_process: ServiceProcess) -> None:
    service_process.workers = 2
    await trio.to_thread.run_sync(service_process.start)
    victim = (await _workers_alive(service_process, 2))[0]
    os.kill(int(victim.split("/")[1]), signal.SIGKILL)
    with trio.fail_after(40):  # restarted after its back-off; the dead node reaped
        while True:
            alive = await trio.to_thread.run_sync(_alive, service_process)
            if len(alive) == 2 and victim not in alive:
                break
            await trio.sleep(0.3)
    # A worker registers its node before it listens, so a restarted intake worker answers a
    # moment after it is listed alive (polled from the database, that moment shows).
    async with httpx.AsyncClient(timeout=5) as client:
        with trio.fail_after(10):
            while True:
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(service_process.url + "/healthz")).status_code == 200:
                        break
                await trio.sleep(0.1)
    assert service_process.signal(signal.SIGTERM) == 0


def test_workers_split_into_intake_and_delivery() -> None:
    assert workers.roles(1, None) == ["all"]
    assert workers.roles(2, None) == ["intake", "delivery"]
    assert workers.roles(3, None) == ["intake", "intake", "delivery"]
    assert workers.roles(4, 3) == ["intake", "delivery", "delivery", "delivery"]
    assert workers.roles(2, 0) == ["all", "all"]


async def test_a_split_that_leaves_no_worker_to_take_mail_is_refused(
    service_process: ServiceProcess,
) -> None:
    done = await trio.to_thread.run_sync(
        partial(
            service_process.cli, "serve", "--workers", "2", "--delivery-workers", "2", check=False
        )
    )
    assert done.returncode == 2
    assert "--delivery-workers 2 leaves no worker to take mail" in done.stderr
    assert "Traceback" not in done.stderr


async def test_platform_admins_list_the_nodes_and_no_one_else(service: Service) -> None:
    admin = await service.account(admin=True)
    tenant = await service.account()
    assert_error(await tenant.client.get("/v1/admin/nodes"), 403, "admin_required")
    listed = await admin.client.get("/v1/admin/nodes")
    assert listed.status_code == 200, listed.text
    [node] = [n for n in listed.json()["items"] if n["id"] == service.running.runtime.node]
    assert (node["role"], node["state"], node["pid"]) == ("all", "alive", os.getpid())
    assert node["stopped_at"] is None and isinstance(node["holds"], dict)
