"""Webhooks: signed deliveries of email events to a real HTTPS receiver, retries, replay,
basic auth for receivers that expect it."""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import pytest
import trio
from trio.testing import MockClock

from engine.webhooks import outbox
from postroom.service import RunningService, serve
from storage.codec import new_id
from storage.database import open_database
from storage.emails import Event
from storage.tx import Tx
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority
from tests.harness.webhooks import EVENTS, create_webhook, signature_valid


async def _recorded(account: Account, webhook_id: str, attempts: int) -> dict[str, Any]:
    """The webhook's only delivery, once `attempts` attempts of it are on record."""
    with trio.fail_after(10):
        while True:
            page = (await account.client.get(f"/v1/webhooks/{webhook_id}/deliveries")).json()
            if page["items"] and page["items"][0]["attempt"] >= attempts:
                item: dict[str, Any] = page["items"][0]
                return item
            await trio.sleep(0.05)


async def test_delivery_events_arrive_signed_with_their_metadata(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    hook = await create_webhook(account, https_receiver)
    assert hook["secret"].startswith("whsec_")
    route_mail(dns_server, "hooks.example")
    sent = (
        await account.client.post(
            "/v1/emails/",
            json=message(["ok@hooks.example", "permfail@hooks.example"], tags=["welcome"]),
        )
    ).json()
    await wait_for_status(account, sent["id"])
    requests = await https_receiver.wait_for_requests(3)
    bodies = []
    for request in requests:
        assert request.path == "/hook"
        assert signature_valid(hook["secret"], request.body, request.headers["x-webhook-signature"])
        bodies.append(json.loads(request.body))
    by_event = {(b["event"], b["recipient"]): b for b in bodies}
    delivered = by_event[("email.delivered", "ok@hooks.example")]
    assert delivered["email_id"] == sent["id"]
    assert delivered["timestamp"].endswith("Z")
    meta = delivered["metadata"]
    assert meta["subject"] == "Your receipt" and meta["tag"] == "welcome"
    assert meta["domain"] == "hooks.example" and meta["smtp_response"].startswith("250")
    assert by_event[("email.sent", "ok@hooks.example")]["metadata"]["domain"] == "hooks.example"
    bounced = by_event[("email.bounced", "permfail@hooks.example")]["metadata"]
    assert bounced["bounce_type"] == "hard" and bounced["response"].startswith("550")
    assert "dsn" in bounced


async def test_failing_receiver_walks_the_schedule_then_dies_and_replay_delivers(
    service: Service, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    https_receiver.respond(500, b'{"error": "down"}')
    assert (await account.client.post(f"/v1/webhooks/{hook['id']}/test")).json() == {
        "queued": True,
        "url": hook["url"],
    }
    await https_receiver.wait_for_requests(1)
    for delay in (60, 300, 1800, 7200, 21600, 86400, 172800):
        count = len(https_receiver.requests)
        await _recorded(account, hook["id"], attempts=count)  # the failure is on record
        # Virtual time also runs at real speed while the test polls: a margin of seconds keeps
        # "not yet" true on a busy machine.
        clock.jump(delay - 5)
        await service.settled()
        assert len(https_receiver.requests) == count, f"retried before {delay} s"
        clock.jump(5)
        await https_receiver.wait_for_requests(count + 1)
    assert len(https_receiver.requests) == 8
    item = await _recorded(account, hook["id"], attempts=8)
    assert item["status"] == "dead" and item["attempt"] == 8 and item["response_status"] == 500
    clock.jump(5 * 86400)
    await service.settled()
    assert len(https_receiver.requests) == 8  # dead letters are not retried

    https_receiver.respond(200)
    replayed = await account.client.post(f"/v1/webhook-deliveries/{item['id']}/replay")
    assert replayed.status_code == 200
    await https_receiver.wait_for_requests(9)
    await service.settled()
    detail = (await account.client.get(f"/v1/webhook-deliveries/{item['id']}")).json()
    assert detail["status"] == "delivered"
    assert detail["payload"]["event"] == "email.delivered"
    assert detail["endpoint_url"] == hook["url"]


async def test_a_hanging_receiver_counts_as_a_failure(
    service: Service, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    https_receiver.respond(200, delay=30)
    await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    await https_receiver.wait_for_requests(1)
    clock.jump(11)
    item = await _recorded(account, hook["id"], attempts=1)
    assert item["status"] == "retrying"
    assert item["response_status"] is None
    detail = (await account.client.get(f"/v1/webhooks/{hook['id']}/deliveries/{item['id']}")).json()
    assert "10 s" in detail["response_body"]


async def test_a_node_declared_dead_mid_post_does_not_overwrite_the_new_holder(
    service: Service, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    """A node whose POST hung past the time it was declared dead (its leases freed, the
    delivery taken and delivered by another node) records nothing of its late failure: the
    delivery stays delivered and is not tried again."""
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    https_receiver.respond(500, delay=30)
    await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    await https_receiver.wait_for_requests(1)

    def delivered_by_another_node(tx: Tx) -> None:
        tx.execute(
            "UPDATE webhook_deliveries SET status = 'delivered', attempt = 1,"
            " response_status = 200, lease_until = NULL, leased_by = NULL"
            " WHERE webhook_id = :hook",
            {"hook": hook["id"]},
        )

    await service.running.runtime.db.write(delivered_by_another_node)
    clock.jump(11)  # the hung POST times out: a failure, on the stale node
    await service.settled()
    [item] = (await account.client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["items"]
    assert (item["status"], item["attempt"], item["response_status"]) == ("delivered", 1, 200)
    clock.jump(120)
    await service.settled()
    assert len(https_receiver.requests) == 1


async def test_paused_webhook_gets_nothing_new(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    hook = await create_webhook(account, https_receiver)
    paused = await account.client.patch(f"/v1/webhooks/{hook['id']}", json={"is_active": False})
    assert paused.json()["is_active"] is False
    assert (await account.client.get("/v1/webhooks/")).json() == []
    route_mail(dns_server, "quiet.example")
    sent = (await account.client.post("/v1/emails/", json=message("q@quiet.example"))).json()
    await wait_for_status(account, sent["id"])
    await service.settled()
    assert https_receiver.requests == []
    await account.client.patch(f"/v1/webhooks/{hook['id']}", json={"is_active": True})
    sent = (await account.client.post("/v1/emails/", json=message("r@quiet.example"))).json()
    await https_receiver.wait_for_requests(2)  # sent + delivered of the second email only
    assert {json.loads(r.body)["recipient"] for r in https_receiver.requests} == {"r@quiet.example"}


async def test_only_subscribed_events_are_sent(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    await create_webhook(account, https_receiver, ["email.delivered"])
    route_mail(dns_server, "sub.example")
    sent = (await account.client.post("/v1/emails/", json=message("s@sub.example"))).json()
    await wait_for_status(account, sent["id"])
    [request] = await https_receiver.wait_for_requests(1)
    await service.settled()
    assert len(https_receiver.requests) == 1
    assert json.loads(request.body)["event"] == "email.delivered"


async def test_deliveries_log_pages_filters_and_counts(
    service: Service, https_receiver: HttpsReceiver
) -> None:
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    https_receiver.respond_sequence([200, 200, 500])
    for _ in range(3):
        await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    await https_receiver.wait_for_requests(3)
    await service.settled()
    url = f"/v1/webhooks/{hook['id']}/deliveries"
    everything = (await account.client.get(url)).json()
    assert everything["total"] == 3 and everything["page"] == 0 and everything["limit"] == 20
    assert set(everything["items"][0]) == {
        "id",
        "webhook_id",
        "event_type",
        "status",
        "response_status",
        "attempt",
        "next_retry_at",
        "created_at",
    }
    page = (await account.client.get(url, params={"limit": 2, "page": 1})).json()
    assert len(page["items"]) == 1 and page["total"] == 3
    delivered = (await account.client.get(url, params={"status": "delivered"})).json()
    assert delivered["total"] == 2
    retrying = (await account.client.get(url, params={"status": "retrying"})).json()
    assert retrying["total"] == 1 and retrying["items"][0]["next_retry_at"] is not None
    for params in ({"limit": 0}, {"limit": 101}, {"status": "lost"}):
        assert (await account.client.get(url, params=params)).status_code == 422


async def test_webhook_rules_and_workspace_scoping(
    service: Service, https_receiver: HttpsReceiver
) -> None:
    account = await service.account()
    other = await service.account()
    for body in (
        {"url": "http://example.com/hook", "events": ["email.sent"]},
        {"url": "https://example.com/hook", "events": ["email.nope"]},
        {"url": "https://example.com/hook", "events": []},
        {"url": "not a url", "events": ["email.sent"]},
        {"events": ["email.sent"]},
    ):
        response = await account.client.post("/v1/webhooks/", json=body)
        assert response.status_code == 422, body
    hook = await create_webhook(account, https_receiver)
    await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    await https_receiver.wait_for_requests(1)
    await service.settled()
    [item] = (await account.client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["items"]
    for method, path in (
        ("PATCH", f"/v1/webhooks/{hook['id']}"),
        ("DELETE", f"/v1/webhooks/{hook['id']}"),
        ("POST", f"/v1/webhooks/{hook['id']}/test"),
        ("GET", f"/v1/webhooks/{hook['id']}/deliveries"),
        ("GET", f"/v1/webhooks/{hook['id']}/deliveries/{item['id']}"),
        ("GET", f"/v1/webhook-deliveries/{item['id']}"),
        ("POST", f"/v1/webhook-deliveries/{item['id']}/replay"),
    ):
        kwargs: dict[str, Any] = {"json": {"is_active": False}} if method == "PATCH" else {}
        response = await other.client.request(method, path, **kwargs)
        assert response.status_code == 404, (method, path)
    assert (await account.client.delete(f"/v1/webhooks/{hook['id']}")).status_code == 204
    assert (await account.client.get("/v1/webhooks/")).json() == []
    assert (await account.client.get(f"/v1/webhook-deliveries/{item['id']}")).status_code == 200


async def test_a_host_repointed_at_a_private_address_after_saving_is_not_called(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
    clock: MockClock,
) -> None:
    """With private targets off, the SSRF rule is applied again at connect (DNS rebinding)."""
    settings = harness.test_settings(
        database_url,
        dns_server,
        allow_private_targets="off",
        extra_ca_file=str(tls_ca.ca_file),
    )
    running: RunningService = await nursery.start(serve, settings)
    service = Service(running, clock)
    try:
        account = await service.account()
        url = f"https://hooks.example.net:{https_receiver.port}/hook"
        direct = await account.client.post(
            "/v1/webhooks/", json={"url": https_receiver.url + "/hook", "events": EVENTS}
        )
        assert direct.status_code == 422  # a loopback URL is refused when saved
        # Saved while the name points at a public address (never contacted by this test)...
        dns_server.set("hooks.example.net", "A", ["93.184.216.34"])
        created = await account.client.post("/v1/webhooks/", json={"url": url, "events": EVENTS})
        assert created.status_code == 201, created.text
        # ...then re-pointed at the operator's loopback, where a receiver listens.
        dns_server.set("hooks.example.net", "A", ["127.0.0.1"])
        hook = created.json()
        await account.client.post(f"/v1/webhooks/{hook['id']}/test")
        attempt = await _recorded(account, hook["id"], 1)
        assert attempt["status"] == "retrying"
        detail = (await account.client.get(f"/v1/webhook-deliveries/{attempt['id']}")).json()
        assert "public address" in (detail["response_body"] or "")
        assert https_receiver.requests == []
    finally:
        await service.aclose()
        running.stop()


def _stored_auth(tx: Tx, webhook_id: str) -> str | None:
    value: str | None = tx.value(
        "SELECT basic_auth FROM webhooks WHERE id = :id", {"id": webhook_id}
    )
    return value


async def test_basic_auth_is_sent_sealed_at_rest_and_never_shown(
    service: Service, https_receiver: HttpsReceiver, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    account = await service.account()
    client = account.client
    password = "s3cret-pass word"
    body = {
        "url": https_receiver.url + "/listmonk",
        "events": EVENTS,
        "basic_auth": {"username": "listmonk", "password": password},
    }
    created = await client.post("/v1/webhooks/", json=body)
    assert created.status_code == 201, created.text
    hook = created.json()
    assert hook["basic_auth"] == {"username": "listmonk"}
    listed = await client.get("/v1/webhooks/")
    assert listed.json()[0]["basic_auth"] == {"username": "listmonk"}
    stored = await service.running.runtime.db.read(_stored_auth, hook["id"])
    assert stored is not None and stored.startswith("enc:v1:") and password not in stored

    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [first] = await https_receiver.wait_for_requests(1)
    expected = "Basic " + base64.b64encode(f"listmonk:{password}".encode()).decode()
    assert first.headers["authorization"] == expected
    assert "x-webhook-signature" in first.headers  # signing stays ours

    # A change that does not name the credentials keeps them; null removes them.
    kept = await client.patch(f"/v1/webhooks/{hook['id']}", json={"events": ["email.bounced"]})
    assert kept.json()["basic_auth"] == {"username": "listmonk"}
    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [_, second] = await https_receiver.wait_for_requests(2)
    assert second.headers["authorization"] == expected
    removed = await client.patch(f"/v1/webhooks/{hook['id']}", json={"basic_auth": None})
    assert removed.json()["basic_auth"] is None
    assert await service.running.runtime.db.read(_stored_auth, hook["id"]) is None
    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [*_, third] = await https_receiver.wait_for_requests(3)
    assert "authorization" not in third.headers

    for shown in (created, listed, kept, await client.get("/v1/audit-log")):
        assert password not in shown.text
    deliveries = (await client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["items"]
    for item in deliveries:
        assert password not in (await client.get(f"/v1/webhook-deliveries/{item['id']}")).text
    assert password not in caplog.text and expected not in caplog.text

    for bad in ({"username": "a:b", "password": "x"}, {"username": "a", "password": "x\r\ny"}):
        refused = await client.post("/v1/webhooks/", json={**body, "basic_auth": bad})
        assert refused.status_code == 422, bad
        assert refused.json()["errors"][0]["loc"][:2] == ["body", "basic_auth"]


async def test_basic_auth_stays_with_the_origin_it_was_given_for(
    service: Service, https_receiver: HttpsReceiver, tls_ca: TlsAuthority, nursery: trio.Nursery
) -> None:
    """Issue 28, item 6: a PATCH to another host once sent the stored password there."""
    elsewhere = HttpsReceiver(tls_ca.server_context())  # another port: another origin
    await nursery.start(elsewhere.run)
    account = await service.account()
    client = account.client
    body = {
        "url": https_receiver.url + "/hook",
        "events": EVENTS,
        "basic_auth": {"username": "owner", "password": "for-the-first-host"},
    }
    hook = (await client.post("/v1/webhooks/", json=body)).json()
    first_auth = "Basic " + base64.b64encode(b"owner:for-the-first-host").decode()

    # Another path on the same origin keeps them.
    same = await client.patch(
        f"/v1/webhooks/{hook['id']}", json={"url": https_receiver.url + "/other"}
    )
    assert same.json()["basic_auth"] == {"username": "owner"}
    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [sent_first] = await https_receiver.wait_for_requests(1)
    assert sent_first.headers["authorization"] == first_auth

    # Another origin drops them: the test event reaches it without them.
    moved = await client.patch(f"/v1/webhooks/{hook['id']}", json={"url": elsewhere.url + "/x"})
    assert moved.status_code == 200 and moved.json()["basic_auth"] is None
    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [arrived] = await elsewhere.wait_for_requests(1)
    assert "authorization" not in arrived.headers
    entries = (await client.get("/v1/audit-log")).json()["items"]
    assert any(str(e["meta"].get("basic_auth", "")).startswith("removed") for e in entries)

    # Given again with the move, the new ones go to the new origin, and never back to the
    # old one: a replay of the delivery made there goes without them.
    again = {**body, "url": elsewhere.url + "/x"}
    del again["events"]
    again["basic_auth"] = {"username": "owner", "password": "for-the-second-host"}
    assert (await client.patch(f"/v1/webhooks/{hook['id']}", json=again)).status_code == 200
    await client.post(f"/v1/webhooks/{hook['id']}/test")
    [_, second] = await elsewhere.wait_for_requests(2)
    assert second.headers["authorization"].startswith("Basic ")
    listed = await client.get(f"/v1/webhooks/{hook['id']}/deliveries")
    first_delivery = listed.json()["items"][-1]  # newest first: the one to the first host
    detail = (await client.get(f"/v1/webhook-deliveries/{first_delivery['id']}")).json()
    assert detail["endpoint_url"].startswith(https_receiver.url)
    replayed = await client.post(f"/v1/webhook-deliveries/{first_delivery['id']}/replay")
    assert replayed.status_code == 200
    [_, replay] = await https_receiver.wait_for_requests(2)
    assert "authorization" not in replay.headers


async def test_a_clean_stop_lets_a_post_under_way_finish_and_records_it(
    database_url: str,
    dns_server: DnsServer,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
    clock: MockClock,
) -> None:
    """A webhook POST the receiver has in hand at a stop is answered and recorded delivered,
    not cut and POSTed again after the restart."""
    https_receiver.respond(200, delay=3.0)  # a slow receiver: the POST is under way at the stop
    settings = harness.test_settings(database_url, dns_server, extra_ca_file=str(tls_ca.ca_file))
    async with trio.open_nursery() as running_in:
        running: RunningService = await running_in.start(serve, settings)
        service = Service(running, clock)
        account = await service.account()
        hook = await create_webhook(account, https_receiver)
        await account.client.post(f"/v1/webhooks/{hook['id']}/test")
        await https_receiver.wait_for_requests(1)
        await service.aclose()
        running.stop()  # the nursery waits until the service has stopped

    async with open_database(database_url) as db:
        statuses = await db.read(_delivery_statuses, hook["id"])
    assert statuses == ["delivered"]
    assert len(https_receiver.requests) == 1


def _delivery_statuses(tx: Tx, webhook_id: str) -> list[str]:
    rows = tx.all(
        "SELECT status FROM webhook_deliveries WHERE webhook_id = :id", {"id": webhook_id}
    )
    return [row["status"] for row in rows]


async def test_an_event_and_its_webhook_deliveries_commit_together(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver
) -> None:
    """The engine function that records an event queues its deliveries in the same unit of
    work (engine/webhooks/outbox.py; storage never calls back into the engine): a unit that
    fails after both leaves neither, one that commits has both."""
    account = await ready_account(service, dns_server)
    await create_webhook(account, https_receiver)
    sent = (await account.client.post("/v1/emails/", json=message("x@unrouted.example"))).json()
    rt = service.running.runtime
    mark = "outbox-unit-" + new_id()
    now = rt.clock.now()

    def record(tx: Tx, fail: bool) -> None:
        event = Event(
            new_id(),
            sent["id"],
            account.workspace_id,
            "delivered",
            "x@unrouted.example",
            {"mark": mark},
            now,
        )
        outbox.record(tx, [event])
        if fail:
            raise RuntimeError("the unit of work fails after the outbox")

    def counts(tx: Tx) -> tuple[int, int]:
        like = {"mark": f"%{mark}%"}
        stored = tx.value("SELECT COUNT(*) FROM email_events WHERE metadata LIKE :mark", like)
        queued = tx.value("SELECT COUNT(*) FROM webhook_deliveries WHERE payload LIKE :mark", like)
        return int(stored), int(queued)

    with pytest.raises(RuntimeError):
        await rt.db.write(record, True)
    assert await rt.db.read(counts) == (0, 0)
    await rt.db.write(record, False)
    assert await rt.db.read(counts) == (1, 1)
