"""Email event names: the events endpoint and the email detail list the spec's names
(`queued`, `sent`, `delivered`, ...), webhook payloads keep theirs (`email.delivered`), and
migration 0013 renames events stored under the old names."""

from __future__ import annotations

import json
from typing import Any

import trio

from storage import migrations
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

SPEC_NAMES = {
    "queued",
    "scheduled",
    "sent",
    "delivered",
    "opened",
    "clicked",
    "bounced",
    "complained",
    "unsubscribed",
    "failed",
    "cancelled",
    "deferred",
    "rejected",
}
WEBHOOK_EVENTS = ["email.sent", "email.delivered", "email.bounced"]


async def _webhook(account: Account, receiver: HttpsReceiver) -> dict[str, Any]:
    created = await account.client.post(
        "/v1/webhooks/", json={"url": receiver.url + "/hook", "events": WEBHOOK_EVENTS}
    )
    assert created.status_code == 201, created.text
    hook: dict[str, Any] = created.json()
    return hook


async def _deliveries(account: Account, webhook_id: str, count: int) -> list[dict[str, Any]]:
    """The webhook's deliveries, once `count` of them are delivered."""
    url = f"/v1/webhooks/{webhook_id}/deliveries"
    with trio.fail_after(10):
        while True:
            page = (await account.client.get(url, params={"status": "delivered"})).json()
            if page["total"] >= count:
                items: list[dict[str, Any]] = page["items"]
                return items
            await trio.sleep(0.05)


async def _types(account: Account, email_id: str) -> list[str]:
    events = (await account.client.get(f"/v1/emails/{email_id}/events")).json()
    return [e["event_type"] for e in events]


async def test_events_endpoint_lists_bare_names_while_webhooks_get_email_names(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
) -> None:
    account = await ready_account(service, dns_server)
    hook = await _webhook(account, https_receiver)
    route_mail(dns_server, "names.example")
    body = message(["ok@names.example", "permfail@names.example"])
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    detail = await wait_for_status(account, sent["id"])

    types = await _types(account, sent["id"])
    assert types[0] == "queued"
    assert sorted(types[1:]) == ["bounced", "delivered", "sent"]
    assert [e["event_type"] for e in detail["events"]] == types
    assert set(types) <= SPEC_NAMES

    requests = await https_receiver.wait_for_requests(3)
    assert sorted(json.loads(r.body)["event"] for r in requests) == sorted(WEBHOOK_EVENTS)
    deliveries = await _deliveries(account, hook["id"], 3)
    assert sorted(d["event_type"] for d in deliveries) == sorted(WEBHOOK_EVENTS)


async def test_a_rejected_email_has_a_rejected_event(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    added = await account.client.post("/v1/suppressions/", json={"email": "gone@names.example"})
    assert added.status_code == 201
    sent = (await account.client.post("/v1/emails/", json=message("gone@names.example"))).json()
    assert sent["status"] == "rejected"
    assert await _types(account, sent["id"]) == ["rejected"]


def _age_events(tx: Tx, email_id: str) -> None:
    """Store the email's events as they were stored before 0013, and forget 0013 was applied."""
    tx.execute(
        "UPDATE email_events SET event_type = 'email.' || event_type WHERE email_id = :id",
        {"id": email_id},
    )
    tx.execute("DELETE FROM schema_migrations WHERE version = 13")


async def test_migration_0013_renames_stored_events_but_not_webhook_names(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
) -> None:
    account = await ready_account(service, dns_server)
    hook = await _webhook(account, https_receiver)
    route_mail(dns_server, "names.example")
    sent = (await account.client.post("/v1/emails/", json=message("ok@names.example"))).json()
    await wait_for_status(account, sent["id"])
    await _deliveries(account, hook["id"], 2)

    db = service.running.runtime.db
    await db.write(_age_events, sent["id"])
    assert await _types(account, sent["id"]) == ["email.queued", "email.sent", "email.delivered"]
    assert await db.transaction(migrations.apply_pending) == [13]

    assert await _types(account, sent["id"]) == ["queued", "sent", "delivered"]
    deliveries = await _deliveries(account, hook["id"], 2)
    assert sorted(d["event_type"] for d in deliveries) == ["email.delivered", "email.sent"]
    [webhook] = (await account.client.get("/v1/webhooks/")).json()
    assert webhook["events"] == WEBHOOK_EVENTS
