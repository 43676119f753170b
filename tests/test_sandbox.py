"""The sandbox end to end: sandboxed mail is captured, never sent; each scripted address
produces its real events and signed webhooks through the normal engine, on the real retry
schedule and, for later outcomes, across a restart; test keys act only in sandbox mode."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import uuid
from dataclasses import replace
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio
from trio.testing import MockClock

from engine.accounts import users
from engine.sandbox.capture import dkim_result
from postroom.service import serve
from storage.sandbox import SigningKey
from tests.harness import service as harness
from tests.harness.clock import minute_after, move_to, now
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import send_inbound
from tests.harness.policies import GROUPED, group_by_mx, grouped_by_mx
from tests.harness.sandbox import DOMAIN, letter, sandbox_account, send
from tests.harness.sending import (
    message,
    ready_account,
    route_mail,
    schedule,
    wait_for_email,
    wait_for_status,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority


async def captured_requests(account: Account, count: int) -> dict[str, Any]:
    """The sandbox's captured requests once there are `count` of them."""
    with trio.fail_after(15):
        while True:
            found: dict[str, Any] = (await account.client.get("/v1/sandbox/requests")).json()
            if found["total"] >= count:
                return found
            await trio.sleep(0.05)


def attempts_are(count: int, email: dict[str, Any]) -> bool:
    return bool(email["recipients"][0]["attempts"] == count)


def events(email: dict[str, Any]) -> list[str]:
    return [e["event_type"] for e in email["events"]]


async def test_sandboxed_mail_is_captured_signed_and_never_sent(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "deliver@customer.example")
    email = await wait_for_status(account, email_id)
    assert email["status"] == "delivered"
    assert events(email) == ["queued", "sent", "delivered"]
    assert "sandbox" in email["events"][-1]["metadata"]["smtp_response"]
    assert smtp_sink.messages == []
    # Not even a question about the recipient's domain left the machine.
    assert not [q for q in dns_server.queries if q.name.endswith("customer.example")]

    listed = (await account.client.get("/v1/sandbox/messages")).json()
    assert listed["total"] == 1
    captured = listed["items"][0]
    assert captured["email_id"] == email_id
    assert captured["recipients"] == ["deliver@customer.example"]
    assert captured["dkim"] == "pass"
    detail = (await account.client.get(f"/v1/sandbox/messages/{captured['id']}")).json()
    assert detail["html"].strip() == "<p>Thanks for your <b>order</b>.</p>"
    assert detail["text"].strip() == "Thanks for your order."
    names = [h["name"].lower() for h in detail["headers"]]
    # Transactional mail: no List-Unsubscribe unless the sender asks (issue 30).
    assert names[0] == "dkim-signature" and "list-unsubscribe" not in names
    source = await account.client.get(f"/v1/sandbox/messages/{captured['id']}/source")
    assert source.headers["content-type"] == "message/rfc822"
    assert source.content == base64.b64decode(detail["source_base64"])


async def test_dkim_result_fails_for_a_message_altered_after_signing(
    service: Service,
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "deliver@customer.example")
    await wait_for_status(account, email_id)
    captured = (await account.client.get("/v1/sandbox/messages")).json()["items"][0]
    detail = (await account.client.get(f"/v1/sandbox/messages/{captured['id']}")).json()
    data = base64.b64decode(detail["source_base64"])
    domain = (await account.client.get("/v1/domains/")).json()[0]
    record = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    key = SigningKey(DOMAIN, record["host"].split(".")[0], record["value"].split("p=")[1])
    assert dkim_result(data, key) == "pass"
    assert dkim_result(data.replace(b"Thanks for your", b"Thanks for my"), key).startswith("fail")


async def test_live_workspaces_mail_in_the_same_round_still_goes_to_the_mx(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    sandboxed = await sandbox_account(service)
    live = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    captured_id = await send(sandboxed, "ann@customer.example")
    sent = await live.client.post("/v1/emails/", json=message("bob@customer.example"))
    assert (await wait_for_status(live, sent.json()["id"]))["status"] == "delivered"
    assert (await wait_for_status(sandboxed, captured_id))["status"] == "delivered"
    assert [m.rcpt_to for m in smtp_sink.messages] == [("bob@customer.example",)]
    assert (await live.client.get("/v1/sandbox/messages")).json()["total"] == 0


async def test_a_domain_queue_that_began_with_sandboxed_mail_still_applies_mx_rules(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    """The queue of one.example first delivers sandboxed mail alone, knowing no MX; live
    mail due there later has its MX looked up, and the rule on the MX hosts' suffix counts
    it with two.example's mail (one rate, one connection), as if the queue began with it."""
    sandboxed = await sandbox_account(service)
    live = await ready_account(service, dns_server)
    await group_by_mx(live, dns_server)
    first = now(service) + timedelta(hours=1)
    later = minute_after(first + timedelta(minutes=1))
    captured = await send(sandboxed, "ann@one.example", send_at=first.isoformat())
    ids = await schedule(live, GROUPED, later)
    move_to(service, clock, minute_after(first))
    assert (await wait_for_status(sandboxed, captured))["status"] == "delivered"
    assert not [q for q in dns_server.queries if q.name == "one.example"]
    move_to(service, clock, later)
    await grouped_by_mx(live, smtp_sink, ids)
    assert [q for q in dns_server.queries if q.name == "one.example" and q.rdtype == "MX"]


async def test_bounce_address_bounces_with_5_1_1_and_is_suppressed(service: Service) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "bounce@customer.example")
    email = await wait_for_status(account, email_id)
    assert email["status"] == "bounced"
    bounced = email["events"][-1]
    assert bounced["event_type"] == "bounced" and "5.1.1" in bounced["metadata"]["response"]
    entry = (await account.client.get("/v1/suppressions/")).json()["items"][0]
    assert (entry["email"], entry["reason"]) == ("bounce@customer.example", "hard_bounce")
    assert (await account.client.get("/v1/sandbox/messages")).json()["total"] == 0


async def test_defer3_then_deliver_follows_the_real_retry_schedule(
    service: Service, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "defer3-then-deliver+order7@customer.example")
    for attempt, step in ((1, 60), (2, 5 * 60), (3, 15 * 60)):
        email = await wait_for_email(account, email_id, partial(attempts_are, attempt))
        assert email["status"] == "deferred"
        deferred = email["events"][-1]
        waited = datetime.fromisoformat(deferred["metadata"]["next_attempt_at"]) - (
            datetime.fromisoformat(deferred["created_at"])
        )
        assert abs(waited - timedelta(seconds=step)) < timedelta(seconds=1)
        assert "4.3.0" in deferred["metadata"]["response"]
        clock.jump(step + 1)
    email = await wait_for_status(account, email_id)
    assert email["status"] == "delivered"
    assert events(email) == ["queued", "deferred", "deferred", "deferred", "sent", "delivered"]


async def test_the_forecast_of_a_sandboxed_backlog_asks_no_dns(
    service: Service, dns_server: DnsServer
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "defer3-then-deliver@customer.example")
    await wait_for_email(account, email_id, partial(attempts_are, 1))
    forecast = (await account.client.get("/v1/delivery/forecast")).json()
    [destination] = forecast["destinations"]
    assert destination["destination"] == "customer.example"
    assert not [q for q in dns_server.queries if q.name.endswith("customer.example")]


async def test_complaint_an_hour_later_survives_a_restart_and_is_signed_to_webhooks(
    service: Service,
    clock: MockClock,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
    database_url: str,
    dns_server: DnsServer,
    nursery: trio.Nursery,
) -> None:
    account = await sandbox_account(service)
    hook = await account.client.post(
        "/v1/webhooks/", json={"url": https_receiver.url, "events": ["email.complained"]}
    )
    secret = hook.json()["secret"]
    email_id = await send(account, "complain-after-1h@customer.example")
    await wait_for_status(account, email_id)
    service.running.stop()  # the outcome waits in the database, not in this process
    settings = harness.test_settings(database_url, dns_server, extra_ca_file=str(tls_ca.ca_file))
    again = await nursery.start(serve, settings)
    clock.jump(3600 + 20)
    headers = {"Authorization": f"Bearer {account.api_key}"}
    async with httpx.AsyncClient(base_url=again.api_url, headers=headers) as client:
        restarted = replace(account, client=client)
        email = await wait_for_email(restarted, email_id, lambda e: "complained" in events(e))
        assert email["events"][-1]["recipient"] == "complain-after-1h@customer.example"
        entry = (await client.get("/v1/suppressions/")).json()["items"][0]
        # Captured as the receiver would have got it, signed; never sent (issue 28).
        [posted] = (await captured_requests(restarted, 1))["items"]
        detail = (await client.get(f"/v1/sandbox/requests/{posted['id']}")).json()
    assert entry["reason"] == "complaint" and entry["source_email_id"] == email_id
    assert json.loads(detail["body"])["event"] == "email.complained"
    expected = hmac.new(secret.encode(), detail["body"].encode(), hashlib.sha256).hexdigest()
    assert detail["signature"] == expected
    assert https_receiver.requests == []
    again.stop()


async def test_open_and_click_are_recorded_a_minute_apart_through_tracking(
    service: Service, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    html = '<p>See <a href="https://shop.example/order/7">your order</a></p>'
    email_id = await send(account, "open-and-click@customer.example", html=html)
    await wait_for_status(account, email_id)
    clock.jump(61)
    email = await wait_for_email(account, email_id, lambda e: "opened" in events(e))
    assert "clicked" not in events(email)
    clock.jump(61)
    email = await wait_for_email(account, email_id, lambda e: "clicked" in events(e))
    clicked = email["events"][-1]
    assert clicked["metadata"]["url"] == "https://shop.example/order/7"
    assert clicked["recipient"] == "open-and-click@customer.example"


async def test_a_complaint_an_hour_away_is_listed_pending_and_can_be_fast_forwarded(
    service: Service, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "complain-after-1h@customer.example")
    await wait_for_status(account, email_id)
    listed = await account.client.get("/v1/sandbox/outcomes", params={"email_id": email_id})
    [pending] = listed.json()
    assert pending["kind"] == "complaint" and pending["email_id"] == email_id
    due = datetime.fromisoformat(pending["due_at"])
    delivered = datetime.fromisoformat(
        (await wait_for_status(account, email_id))["events"][-1]["created_at"]
    )
    assert due - delivered >= timedelta(minutes=59)
    other = await account.client.post(
        "/v1/sandbox/outcomes/fast-forward", json={"email_id": str(uuid.uuid4())}
    )
    assert other.json() == {"fast_forwarded": 0}
    moved = await account.client.post(
        "/v1/sandbox/outcomes/fast-forward", json={"email_id": email_id}
    )
    assert moved.status_code == 200 and moved.json() == {"fast_forwarded": 1}
    clock.jump(16)  # the worker's next pass, not the hour
    email = await wait_for_email(account, email_id, lambda e: "complained" in events(e))
    assert datetime.fromisoformat(email["events"][-1]["created_at"]) - delivered < timedelta(
        minutes=1
    )
    assert (await account.client.get("/v1/sandbox/outcomes")).json() == []
    refused = await account.client.post("/v1/sandbox/outcomes/fast-forward", json={"when": "now"})
    assert refused.status_code == 422


async def test_slow_address_is_answered_after_thirty_seconds(
    service: Service, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "slow@customer.example")
    await trio.sleep(0.3)
    assert (await account.client.get(f"/v1/emails/{email_id}")).json()["status"] == "queued"
    # Time moves on until the answer comes: on a busy machine the round may start its wait
    # only after a first jump. The 30 s are then read from the (virtual) time of the capture.
    for _ in range(20):  # a bounded number of jumps (a deadline would move with them)
        email = (await account.client.get(f"/v1/emails/{email_id}")).json()
        if email["status"] == "delivered":
            break
        clock.jump(31)
        await trio.sleep(0.5)
    assert email["status"] == "delivered"
    queued = datetime.fromisoformat(email["events"][0]["created_at"])
    captured = (await account.client.get(f"/v1/sandbox/messages?email_id={email_id}")).json()
    answered = datetime.fromisoformat(captured["items"][0]["created_at"])
    assert answered - queued >= timedelta(seconds=30)
    # The timeline says the message went when the server answered, not when it was asked.
    sent = next(e for e in email["events"] if e["event_type"] == "sent")
    assert abs(datetime.fromisoformat(sent["created_at"]) - answered) < timedelta(seconds=1)


async def test_test_keys_act_only_in_sandbox_mode(service: Service) -> None:
    account = await sandbox_account(service)
    created = await account.client.post("/v1/sandbox/test-keys", json={"name": "ci"})
    assert created.status_code == 201
    raw = created.json()["key"]
    assert raw.startswith("svc_k_test_") and created.json()["key_prefix"].startswith("test_")
    tester = service.client(headers={"Authorization": f"Bearer {raw}"})
    email_id = (await tester.post("/v1/emails/", json=letter("deliver@customer.example"))).json()
    assert (await wait_for_status(account, email_id["id"]))["status"] == "delivered"

    refused = await tester.put("/v1/sandbox", json={"enabled": False})
    assert refused.status_code == 403 and refused.json()["code"] == "test_key_forbidden"
    left = await account.client.put("/v1/sandbox", json={"enabled": False})
    assert left.status_code == 200 and left.json()["enabled"] is False
    outside = await tester.get("/v1/emails/")
    assert outside.status_code == 403 and outside.json()["code"] == "sandbox_only"
    again = await account.client.post("/v1/sandbox/test-keys", json={"name": "ci2"})
    assert again.status_code == 403 and again.json()["code"] == "sandbox_only"


async def test_entering_the_sandbox_needs_a_platform_administrator(service: Service) -> None:
    account = await service.account("starter")
    refused = await account.client.put("/v1/sandbox", json={"enabled": True})
    assert refused.status_code == 403 and refused.json()["code"] == "admin_required"
    domain = (await account.client.post("/v1/domains/", json={"name": DOMAIN})).json()
    marked = await account.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert marked.status_code == 403 and marked.json()["code"] == "sandbox_only"
    assert (await account.client.get("/v1/sandbox")).json()["enabled"] is False


async def test_leaving_waits_for_queued_mail_and_makes_sandbox_domains_pending(
    service: Service, clock: MockClock
) -> None:
    account = await sandbox_account(service)
    email_id = await send(account, "defer3-then-deliver@customer.example")
    await wait_for_status(account, email_id, ("deferred",))
    refused = await account.client.put("/v1/sandbox", json={"enabled": False})
    assert refused.status_code == 409
    assert refused.json()["code"] == "sandbox_mail_waiting" and refused.json()["waiting"] == 1
    for attempt, step in ((1, 60), (2, 5 * 60), (3, 15 * 60)):
        # Each retry is waited for before time moves on: it is scheduled from its own attempt.
        await wait_for_email(account, email_id, partial(attempts_are, attempt))
        clock.jump(step + 1)
    await wait_for_status(account, email_id)
    left = await account.client.put("/v1/sandbox", json={"enabled": False})
    assert left.status_code == 200 and left.json()["sandbox_verified_domains"] == []
    domain = (await account.client.get("/v1/domains/")).json()[0]
    assert domain["status"] == "pending"
    log = (await account.client.get("/v1/audit-log?range=24h")).json()["items"]
    actions = [entry["action"] for entry in log]
    assert set(actions[:2]) == {"sandbox.disabled", "domain.pending"}  # one unit of work
    assert "sandbox.enabled" in actions and "domain.verified" in actions
    refused_send = await account.client.post("/v1/emails/", json=letter("a@customer.example"))
    assert refused_send.status_code == 422  # the domain must now prove itself in DNS


async def test_a_name_verified_by_another_workspace_cannot_be_marked_in_the_sandbox(
    service: Service, dns_server: DnsServer
) -> None:
    await ready_account(service, dns_server)  # verifies mail.example.org through DNS
    account = await service.account("starter", admin=True)
    await account.client.put("/v1/sandbox", json={"enabled": True})
    domain = (await account.client.post("/v1/domains/", json={"name": "mail.example.org"})).json()
    marked = await account.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert marked.status_code == 409 and marked.json()["code"] == "domain_taken"


async def test_install_setting_puts_new_workspaces_in_the_sandbox(service: Service) -> None:
    rt = replace(service.running.runtime, sandbox=True)
    created = await users.create_account(rt, "new@example.org", "a long password")
    client = service.client(headers={"Authorization": f"Bearer {created.api_key}"})
    state = (await client.get("/v1/sandbox")).json()
    assert state["enabled"] is True
    assert {s["local_part"] for s in state["scripts"]} >= {"bounce", "complain-after-1h"}
    log = (await client.get("/v1/audit-log?range=24h&category=security")).json()["items"]
    enabled = next(entry for entry in log if entry["action"] == "sandbox.enabled")
    assert enabled["meta"] == {"by": "POSTROOM_SANDBOX"}


def test_sandbox_setting_is_read_from_the_environment() -> None:
    from postroom import config

    assert config.load({"POSTROOM_SANDBOX": "on"}).sandbox is True
    assert config.load({}).sandbox is False


async def test_webhooks_forwards_and_transfer_notices_of_a_sandbox_never_leave(
    service: Service, smtp_sink: SmtpSink, https_receiver: HttpsReceiver, dns_server: DnsServer
) -> None:
    """Issue 28, item 9: the banner said nothing leaves, yet webhooks, URL forwards and
    transfer notices did. Each is now captured and shown, signature and body."""
    account = await sandbox_account(service)
    hook = await account.client.post(
        "/v1/webhooks/",
        json={
            "url": https_receiver.url + "/hook",
            "events": ["email.delivered"],
            "basic_auth": {"username": "hooks", "password": "never-shown"},
        },
    )
    assert hook.status_code == 201, hook.text
    secret = hook.json()["secret"]
    [domain] = (await account.client.get("/v1/domains/")).json()
    dns_server.set(DOMAIN, "MX", [f"10 {harness.SMTP_HOST}."])  # mail to it comes to us
    forward = {
        "source_email": f"support@{DOMAIN}",
        "domain_id": domain["id"],
        "destination_urls": [https_receiver.url + "/inbound"],
    }
    created = await account.client.post("/v1/forwards/", json=forward)
    assert created.status_code == 201, created.text
    target = await service.account()
    offered = await account.client.post(
        f"/v1/domains/{domain['id']}/transfer", json={"target_email": target.email}
    )
    assert offered.status_code == 200, offered.text

    await wait_for_status(account, await send(account, "deliver@customer.example"))
    inbound = message("x@y.example", subject="Help please")
    data = (
        f"From: ann@sender.example\r\nTo: support@{DOMAIN}\r\nSubject: Help please\r\n\r\n"
        f"{inbound['text']}\r\n"
    ).encode()
    assert await send_inbound(service, [f"support@{DOMAIN}"], data) == set()

    found = await captured_requests(account, 2)
    by_kind = {item["kind"]: item for item in found["items"]}
    assert set(by_kind) == {"webhook", "forward"}
    assert by_kind["webhook"]["url"] == https_receiver.url + "/hook"
    hooked = (await account.client.get(f"/v1/sandbox/requests/{by_kind['webhook']['id']}")).json()
    expected = hmac.new(secret.encode(), hooked["body"].encode(), hashlib.sha256).hexdigest()
    assert hooked["signature"] == expected
    assert json.loads(hooked["body"])["event"] == "email.delivered"
    headers = {h["name"]: h["value"] for h in hooked["headers"]}
    assert "'hooks'" in headers["Authorization"]
    assert "never-shown" not in str(hooked["headers"])
    posted = (await account.client.get(f"/v1/sandbox/requests/{by_kind['forward']['id']}")).json()
    assert posted["url"] == https_receiver.url + "/inbound"
    assert json.loads(posted["body"])["subject"] == "Help please"
    log = (await account.client.get("/v1/forwards/logs")).json()
    assert len(log) == 1  # forwarded, as far as the workspace can tell
    deliveries = await account.client.get(f"/v1/webhooks/{hook.json()['id']}/deliveries")
    assert deliveries.json()["items"][0]["status"] == "delivered"

    mail = (await account.client.get("/v1/sandbox/messages")).json()["items"]
    [notice] = [m for m in mail if m["subject"].startswith("Transfer of")]
    assert notice["recipients"] == [target.email]
    text = (await account.client.get(f"/v1/sandbox/messages/{notice['id']}")).json()["text"]
    assert "withheld by the sandbox" in text  # the recipient's accept token is theirs alone
    async with service.client() as browser:  # the console shows it as the API does
        login = {"email": account.email, "password": account.password}
        assert (await browser.post("/v1/auth/login", json=login)).status_code == 200
        listing = await browser.get("/sandbox")
        assert "Captured requests (2)" in listing.text
        page = await browser.get(f"/sandbox/requests/{by_kind['webhook']['id']}")
        assert page.status_code == 200 and hooked["signature"] in page.text

    await service.settled()  # anything on its way out would have arrived by now
    assert https_receiver.requests == []
    assert smtp_sink.messages == []

    # An erasure reaches the captured requests too.
    erased = await account.client.post(
        "/v1/privacy/erase", json={"email": "deliver@customer.example"}
    )
    assert erased.json()["sandbox_requests"] == 1
    hooked = (await account.client.get(f"/v1/sandbox/requests/{by_kind['webhook']['id']}")).json()
    assert "deliver@customer.example" not in hooked["body"]


async def test_a_sandboxed_workspace_tries_a_forward_by_injecting_inbound_mail(
    service: Service,
) -> None:
    account = await sandbox_account(service)
    domain = (await account.client.get("/v1/domains/")).json()[0]
    # No MX record points here: the sandbox takes the forward all the same.
    created = await account.client.post(
        "/v1/forwards/",
        json={
            "source_email": f"support@{DOMAIN}",
            "domain_id": domain["id"],
            "destination_emails": ["deliver@customer.example"],
        },
    )
    assert created.status_code == 201, created.text
    injected = await account.client.post(
        "/v1/sandbox/inbound",
        json={"to": f"Support@{DOMAIN}", "from_address": "jo@elsewhere.example", "subject": "Hi"},
    )
    assert injected.status_code == 202 and injected.json()["forward_id"] == created.json()["id"]
    with trio.fail_after(15):
        while True:  # the forwarder works in the background
            found = (await account.client.get("/v1/emails/?source=forward")).json()
            if found:
                break
            await trio.sleep(0.05)
    [copy] = found
    assert copy["to_addresses"] == ["deliver@customer.example"]
    assert (await wait_for_status(account, copy["id"]))["status"] == "delivered"
    captured = (await account.client.get(f"/v1/sandbox/messages?email_id={copy['id']}")).json()
    assert captured["total"] == 1  # captured like the rest of its mail, never sent
    one = captured["items"][0]["id"]
    headers = (await account.client.get(f"/v1/sandbox/messages/{one}")).json()["headers"]
    assert {"name": "Subject", "value": "Hi"} in headers

    stranger = await account.client.post("/v1/sandbox/inbound", json={"to": f"nobody@{DOMAIN}"})
    assert stranger.status_code == 422 and stranger.json()["code"] == "not_a_forward"
    assert (await account.client.put("/v1/sandbox", json={"enabled": False})).status_code == 200
    outside = await account.client.post("/v1/sandbox/inbound", json={"to": f"support@{DOMAIN}"})
    assert outside.status_code == 403 and outside.json()["code"] == "sandbox_only"
