"""Structured logs of `postroom serve`: JSON lines, no secrets, and a shutdown line that says
what was left queued for the next start."""

from __future__ import annotations

import json
import logging
import signal

import httpx
import trio

from postroom.logs import REDACTED, JsonFormatter
from tests.harness.cli import PASSWORD, create_account
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, message, route_mail
from tests.harness.service import ServiceProcess, free_port


async def _deferred_email_and_failing_webhook(
    url: str, api_key: str, dns_server: DnsServer
) -> None:
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {api_key}"}, timeout=30
    ) as client:
        domain = (await client.post("/v1/domains/", json={"name": SENDER.split("@")[1]})).json()
        dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
        dns_server.set(dkim["host"], "TXT", [dkim["value"]])
        assert (await client.post(f"/v1/domains/{domain['id']}/verify")).status_code == 200
        assert (await client.post("/v1/senders/", json={"email": SENDER})).status_code == 201
        hook = {"url": f"https://127.0.0.1:{free_port()}/hook", "events": ["email.delivered"]}
        made = await client.post("/v1/webhooks/", json=hook)
        assert made.status_code == 201
        # A sample delivery to a port nobody listens on: it fails and waits for its retry.
        assert (await client.post(f"/v1/webhooks/{made.json()['id']}/test")).is_success
        sent = await client.post("/v1/emails/", json=message("ann@dest.example"))
        assert sent.status_code == 202
        with trio.fail_after(15):
            while True:
                deliveries = (await client.get(f"/v1/emails/{sent.json()['id']}")).json()
                if deliveries["status"] == "deferred":
                    break
                await trio.sleep(0.05)


async def test_serve_logs_json_lines_without_secrets_and_what_it_left_queued(
    service_process: ServiceProcess, dns_server: DnsServer
) -> None:
    route_mail(dns_server, "dest.example")
    service_process.env.update(
        {
            "POSTROOM_DNS_SERVERS": dns_server.nameserver,
            "POSTROOM_DELIVERY_PORT": str(free_port()),  # nobody listens: every attempt defers
            "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
        }
    )
    created = await trio.to_thread.run_sync(create_account, service_process, "logs@example.org")
    await trio.to_thread.run_sync(service_process.start)
    await _deferred_email_and_failing_webhook(service_process.url, created["api_key"], dns_server)
    await trio.sleep(0.5)  # the webhook's first POST fails and is rescheduled

    assert await trio.to_thread.run_sync(service_process.signal, signal.SIGTERM) == 0
    output = service_process.output()

    lines = [json.loads(line) for line in output.splitlines()]
    for line in lines:
        assert {"ts", "level", "logger", "message"} <= set(line), line
        assert line["ts"].endswith("Z")
    assert created["api_key"] not in output
    assert PASSWORD not in output
    assert any(line.get("signal") == "SIGTERM" for line in lines)
    [last] = [line for line in lines if "queued_emails" in line]
    assert last is lines[-1]
    assert last["level"] == "info"
    assert (last["queued_emails"], last["deferred_emails"], last["scheduled_emails"]) == (0, 1, 0)
    assert last["pending_webhook_deliveries"] == 1


def test_secrets_in_a_record_are_redacted() -> None:
    key = "svc_k_" + "A" * 43
    record = logging.LogRecord("postroom.api", logging.INFO, __file__, 1, "key %s", (key,), None)
    record.password = "hunter2"  # as if passed with extra=
    record.domain = "example.org"

    line = json.loads(JsonFormatter().format(record))

    assert line["message"] == f"key {REDACTED}"
    assert line["password"] == REDACTED
    assert line["domain"] == "example.org"
