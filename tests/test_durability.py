"""Nothing accepted is lost: kill -9 during delivery, restart, and every email arrives."""

from __future__ import annotations

import json
import re

import httpx
import trio

from tests.harness.dns_server import DnsServer
from tests.harness.service import ServiceProcess
from tests.harness.smtp_sink import SmtpSink

EMAILS = 120
SENDING_DOMAIN = "mail.example.org"


async def _prepare(proc: ServiceProcess, dns_server: DnsServer) -> httpx.AsyncClient:
    created = await trio.to_thread.run_sync(
        lambda: proc.cli(
            "accounts",
            "create",
            "--email",
            "ops@example.org",
            "--password",
            "durable-password",
            "--plan",
            "business",
        )
    )
    key = json.loads(created.stdout)["api_key"]
    client = httpx.AsyncClient(
        base_url=proc.url,
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
        limits=httpx.Limits(max_keepalive_connections=0),
    )
    domain = (await client.post("/v1/domains/", json={"name": SENDING_DOMAIN})).json()
    dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    assert (await client.post(f"/v1/domains/{domain['id']}/verify")).json()["status"] == "verified"
    await client.post("/v1/senders/", json={"email": f"news@{SENDING_DOMAIN}"})
    dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
    dns_server.set("mx.dest.example", "A", ["127.0.0.1"])
    return client


async def test_kill_during_delivery_loses_nothing(
    service_process: ServiceProcess, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    service_process.env["POSTROOM_DNS_SERVERS"] = dns_server.nameserver
    service_process.env["POSTROOM_DELIVERY_PORT"] = str(smtp_sink.port)
    await trio.to_thread.run_sync(service_process.start)
    client = await _prepare(service_process, dns_server)
    accepted: list[str] = []

    async def send(i: int) -> None:
        body = {
            "from_": {"email": f"news@{SENDING_DOMAIN}"},
            "to": [{"email": f"reader{i}@dest.example"}],
            "subject": f"Issue {i}",
            "text": "Hello.",
        }
        response = await client.post("/v1/emails/", json=body)
        assert response.status_code == 202
        accepted.append(response.json()["message_id"])

    try:
        limiter = trio.CapacityLimiter(20)

        async def limited(i: int) -> None:
            async with limiter:
                await send(i)

        async with trio.open_nursery() as nursery:
            for i in range(EMAILS):
                nursery.start_soon(limited, i)
        assert len(accepted) == EMAILS

        # Kill while delivery is under way (some arrived, most not yet).
        delivered_before = len(smtp_sink.messages)
        assert service_process.process is not None
        service_process.process.kill()
        await trio.to_thread.run_sync(service_process.process.wait)
        service_process.stop()

        await trio.to_thread.run_sync(service_process.start)
        with trio.fail_after(60):
            while True:
                arrived = {
                    m.group(1).decode()
                    for message in smtp_sink.messages
                    if (m := re.search(rb"^Message-ID: (<[^>]+>)", message.data, re.M | re.I))
                }
                if arrived >= set(accepted):
                    break
                await trio.sleep(0.1)
    finally:
        await client.aclose()

    duplicates = len(smtp_sink.messages) - len(arrived)
    print(f"delivered before the kill: {delivered_before}; duplicates after restart: {duplicates}")
    assert set(accepted) <= arrived
