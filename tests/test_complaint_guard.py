"""The complaint-rate guard (issue 31, section 4), end to end: the sink accepts the mail,
feedback reports reach the inbound MX at abuse@, and the sending domain's rate over its
delivered recipients pauses its broadcasts above 0.1% and stops its mail that offers
unsubscribe above 0.3%, transactional mail still going, until a person resumes them.

The operator's minimum volume is lowered to 400 so that one complaint (0.22% of 452
delivered) and then two (0.44%) cross the real limits in a few seconds.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio

from engine.webhooks import outbox
from postroom import config
from postroom.service import serve
from tests.harness import service as harness
from tests.harness.bounce_domain import feedback_report
from tests.harness.broadcasts import sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import poll, send_inbound
from tests.harness.sending import (
    SENDING_DOMAIN,
    message,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

GUARD = "/v1/workspace/complaint-guard"
CUSTOMERS = "customers.example"  # the sink accepts at once
SLOW = "slow.example"  # the sink defers the first attempt: mail still waits when reports come


async def _guarded_service(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: Any,
) -> Service:
    settings = harness.test_settings(
        database_url,
        dns_server,
        delivery_port=str(smtp_sink.port),
        extra_ca_file=str(tls_ca.ca_file),  # trusts the webhook receiver's certificate
        complaint_min_deliveries="400",
    )
    return harness.Service(await nursery.start(serve, settings), clock)


async def _broadcast(account: Account, addresses: list[str], subject: str) -> dict[str, Any]:
    contact_list = await create_list(account, name=subject)
    for address in addresses:
        await add_contact(account, contact_list["id"], address)
    sent = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json={
            "contact_list_id": contact_list["id"],
            "sender_address_id": await sender_id(account),
            "subject": subject,
            "text": "News for {{email}}.",
        },
    )
    assert sent.status_code == 200, sent.text
    [broadcast] = [
        b for b in (await account.client.get("/v1/broadcasts/")).json() if b["name"] == subject
    ]
    return dict(broadcast)


async def _emails_to(account: Account, address: str) -> list[dict[str, Any]]:
    found = await account.client.get("/v1/emails/search", params={"q": f"to:{address}"})
    assert found.status_code == 200, found.text
    items: list[dict[str, Any]] = found.json()
    return [(await account.client.get(f"/v1/emails/{e['id']}")).json() for e in items]


async def _complain(service: Service, account: Account, address: str) -> None:
    [email] = await _emails_to(account, address)
    await wait_for_status(account, email["id"], ("delivered",))
    report = feedback_report(f"abuse@{SENDING_DOMAIN}", email["message_id"])
    assert await send_inbound(service, [f"abuse@{SENDING_DOMAIN}"], report, sender="") == set()
    await poll(
        account,
        f"/v1/emails/{email['id']}",
        lambda e: any(x["event_type"] == "complained" for x in e["events"]),
    )


async def _broadcast_status(account: Account, broadcast_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await account.client.get(f"/v1/broadcasts/{broadcast_id}")).json()
    return found


async def _activity(account: Account) -> list[str]:
    entries = (await account.client.get("/v1/audit-log/", params={"limit": 100})).json()
    return [e["action"] for e in entries["items"]]


async def test_complaints_pause_broadcasts_then_stop_marketing_until_a_person_resumes(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    https_receiver: HttpsReceiver,
    clock: trio.testing.MockClock,
) -> None:
    service = await _guarded_service(nursery, database_url, dns_server, smtp_sink, tls_ca, clock)
    try:
        account = await ready_account(service, dns_server)
        hook = await account.client.post(
            "/v1/webhooks/",
            json={"url": https_receiver.url + "/hook", "events": list(outbox.SENDER_EVENTS)},
        )
        assert hook.status_code == 201, hook.text
        route_mail(dns_server, CUSTOMERS)
        route_mail(dns_server, SLOW)
        [domain] = (await account.client.get("/v1/domains/")).json()
        # 450 transactional recipients delivered, in three emails of 150.
        for n in range(3):
            boxes = [{"email": f"r{n}-{i}@{CUSTOMERS}"} for i in range(150)]
            body = {**message([]), "to": boxes[:50], "cc": boxes[50:100], "bcc": boxes[100:]}
            sent = await account.client.post("/v1/emails/", json=body)
            assert sent.status_code == 202, sent.text
            await wait_for_status(account, sent.json()["id"], ("delivered",))
        # A broadcast delivered (the complaints will be about it), one still waiting.
        await _broadcast(account, [f"ann@{CUSTOMERS}", f"bob@{CUSTOMERS}"], "Spring news")
        for name in ("cat", "dan", "eve"):
            smtp_sink.fail_first(f"{name}@{SLOW}", 1)
        waiting = await _broadcast(account, [f"cat@{SLOW}", f"dan@{SLOW}"], "Summer news")
        offer = message(f"eve@{SLOW}", unsubscribe=True, subject="Offer")
        marketing = (await account.client.post("/v1/emails/", json=offer)).json()
        for email in [*await _emails_to(account, f"cat@{SLOW}"), marketing]:
            await wait_for_status(account, email["id"], ("deferred",))

        # One complaint in 452 delivered (0.22%): above the workspace's own pause rate, the
        # waiting broadcast pauses, its mail held.
        guard = await account.client.put(GUARD, json={"pause_rate": 0.002})
        assert guard.status_code == 200, guard.text
        await _complain(service, account, f"ann@{CUSTOMERS}")
        paused = await _broadcast_status(account, waiting["id"])
        assert (paused["status"], paused["pause_reason"]) == ("paused", "complaint_rate")
        [cat] = await _emails_to(account, f"cat@{SLOW}")
        assert [r["status"] for r in cat["recipients"]] == ["held"]
        assert "broadcast.paused" in await _activity(account)
        [paused_event] = [r.json() for r in await https_receiver.wait_for_requests(1)]
        assert paused_event["event"] == "broadcast.paused"
        assert paused_event["data"]["broadcast_id"] == waiting["id"]
        assert paused_event["data"]["complaints"] == 1
        assert paused_event["data"]["delivered"] == 452
        assert paused_event["data"]["pause_rate"] == 0.002
        # Under 0.3% marketing mail still goes.
        still = (await account.client.get(f"/v1/emails/{marketing['id']}")).json()
        assert [r["status"] for r in still["recipients"]] == ["deferred"]
        assert (await account.client.get("/v1/domains/")).json()[0]["marketing_stopped_at"] is None

        # Two (0.44%): mail that offers unsubscribe stops; transactional mail still goes.
        await _complain(service, account, f"bob@{CUSTOMERS}")
        held = (await account.client.get(f"/v1/emails/{marketing['id']}")).json()
        assert [r["status"] for r in held["recipients"]] == ["held"]
        assert (await account.client.get("/v1/domains/")).json()[0]["marketing_stopped_at"]
        refused = await account.client.post(
            "/v1/emails/", json=message(f"fay@{CUSTOMERS}", unsubscribe=True)
        )
        assert refused.status_code == 409, refused.text
        assert refused.json()["code"] == "marketing_stopped"
        receipt = (
            await account.client.post("/v1/emails/", json=message(f"gus@{CUSTOMERS}"))
        ).json()
        await wait_for_status(account, receipt["id"], ("delivered",))
        assert "domain.marketing_stopped" in await _activity(account)
        stopped_event = (await https_receiver.wait_for_requests(2))[1].json()
        assert stopped_event["event"] == "domain.marketing_stopped"
        assert stopped_event["data"]["domain_id"] == domain["id"]
        # The broadcast cannot resume while the domain is stopped.
        early = await account.client.post(f"/v1/broadcasts/{waiting['id']}/resume")
        assert early.status_code == 409 and early.json()["code"] == "marketing_stopped"

        # A person resumes the domain, then the broadcast: the held mail is delivered.
        resumed = await account.client.post(f"/v1/domains/{domain['id']}/marketing/resume")
        assert resumed.status_code == 200, resumed.text
        assert resumed.json()["marketing_stopped_at"] is None
        await wait_for_status(account, marketing["id"], ("delivered",))
        again = await account.client.post(f"/v1/broadcasts/{waiting['id']}/resume")
        assert again.status_code == 200, again.text
        assert (again.json()["status"], again.json()["pause_reason"]) == ("sent", None)
        for email in await _emails_to(account, f"cat@{SLOW}"):
            await wait_for_status(account, email["id"], ("delivered",))
        twice = await account.client.post(f"/v1/broadcasts/{waiting['id']}/resume")
        assert twice.status_code == 409 and twice.json()["code"] == "not_paused"
    finally:
        await service.aclose()
        service.running.stop()


async def test_the_pause_rate_is_the_workspaces_own_within_the_bounds(service: Service) -> None:
    account = await service.account()
    defaults = (await account.client.get(GUARD)).json()
    assert defaults == {
        "pause_rate": 0.001,
        "default_pause_rate": 0.001,
        "pause_rate_bounds": [0.0005, 0.003],
        "stop_rate": 0.003,
        "min_deliveries": 1000,
        "window_days": 30,
    }
    changed = await account.client.put(GUARD, json={"pause_rate": 0.0005})
    assert changed.status_code == 200 and changed.json()["pause_rate"] == 0.0005
    assert (await account.client.get(GUARD)).json()["pause_rate"] == 0.0005
    for bad in ({"pause_rate": 0.004}, {"pause_rate": 0.0001}, {"pause_rate": "x"}, {}):
        refused = await account.client.put(GUARD, json=bad)
        assert refused.status_code == 422, (bad, refused.text)
    unknown = await account.client.put(GUARD, json={"pause_rate": None, "stop_rate": 0.5})
    assert unknown.status_code in (400, 422), unknown.text
    back = await account.client.put(GUARD, json={"pause_rate": None})
    assert back.status_code == 200 and back.json()["pause_rate"] == 0.001
    assert (await _activity(account)).count("complaint_guard.updated") == 2


def test_the_minimum_volume_is_a_whole_number_of_at_least_one() -> None:
    assert config.load({"POSTROOM_COMPLAINT_MIN_DELIVERIES": "250"}).complaint_min_deliveries == 250
    assert config.load({}).complaint_min_deliveries == 1000
    for bad in ("0", "-5", "1.5", "many", ""):
        with pytest.raises(config.SettingsError, match="COMPLAINT_MIN_DELIVERIES"):
            config.load({"POSTROOM_COMPLAINT_MIN_DELIVERIES": bad})
