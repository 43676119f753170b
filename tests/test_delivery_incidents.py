"""Destination incidents on both engines against the SMTP sink: a sender-side block defers
its recipient without suppressing it and pauses the destination for the sending domain
(API, /metrics) until a later round delivers; a mailbox that does not exist still bounces and
is suppressed; the pause widens on repeat."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest
from trio.testing import MockClock

from engine.delivery.incidents import pause_for
from tests.harness.dns_server import DnsServer
from tests.harness.metrics import scrape
from tests.harness.sending import (
    SENDING_DOMAIN,
    message,
    ready_account,
    route_mail,
    wait_for_email,
    wait_for_status,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

REPUTATION_BLOCK = (
    "5.7.1 Service unavailable; Client host [127.0.0.1] blocked due to low reputation of"
    " the sending IP"
)


async def incidents(account: Account, status: str = "open") -> list[dict[str, Any]]:
    response = await account.client.get("/v1/delivery/incidents", params={"status": status})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_a_reputation_block_defers_without_suppressing_and_pauses_the_destination(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "blocked.example")
    smtp_sink.fail_first("ann@blocked.example", 1, code=550, text=REPUTATION_BLOCK)
    first = (await account.client.post("/v1/emails/", json=message("ann@blocked.example"))).json()

    email = await wait_for_status(account, first["id"], ("deferred",))
    deferral = email["events"][-1]
    assert deferral["event_type"] == "deferred"
    assert deferral["metadata"]["incident"] == "blocked"
    assert (await account.client.get("/v1/suppressions/")).json()["items"] == []
    [incident] = await incidents(account)
    assert incident["destination"] == "blocked.example"
    assert incident["sending_domain"] == SENDING_DOMAIN
    assert (incident["kind"], incident["status"], incident["strikes"]) == ("blocked", "open", 1)
    assert "low reputation of the sending IP" in incident["sample_reply"]
    paused = datetime.fromisoformat(incident["paused_until"])
    assert paused - datetime.fromisoformat(incident["first_seen_at"]) == timedelta(minutes=15)
    samples = await scrape(service)
    open_metric = (
        "postroom_delivery_incidents_open",
        (("destination", "other"), ("kind", "blocked")),  # no tenant's domain names
    )
    assert samples[open_metric] == 1

    # Mail from the same sending domain to the paused destination waits, though it is due.
    second = (await account.client.post("/v1/emails/", json=message("bob@blocked.example"))).json()
    await service.settled()
    assert smtp_sink.messages == []
    assert (await account.client.get(f"/v1/emails/{second['id']}")).json()["status"] == "queued"

    clock.jump(15 * 60 + 1)  # the pause is over: both go, and the delivery resolves it
    for sent in (first, second):
        assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"
    # The round records its outcomes, and the resolution with them, before the emails read
    # delivered: nothing is open any more.
    assert await incidents(account) == []
    [resolved] = await incidents(account, "resolved")
    assert resolved["status"] == "resolved"
    assert resolved["resolved_at"] is not None
    assert (await scrape(service)).get(open_metric) is None


async def test_a_block_that_repeats_widens_the_pause_until_a_delivery_ends_it(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "strict.example")
    smtp_sink.fail_first("ann@strict.example", 2, code=550, text=REPUTATION_BLOCK)
    sent = (await account.client.post("/v1/emails/", json=message("ann@strict.example"))).json()
    await wait_for_status(account, sent["id"], ("deferred",))
    [incident] = await incidents(account)
    assert incident["strikes"] == 1

    clock.jump(15 * 60 + 1)  # tried again when the pause ends: blocked again
    await wait_for_email(
        account,
        sent["id"],
        lambda email: [e["event_type"] for e in email["events"]].count("deferred") == 2,
    )
    [incident] = await incidents(account)  # recorded in the same unit as the deferral
    assert incident["strikes"] == 2
    widened = datetime.fromisoformat(incident["paused_until"])
    assert widened - datetime.fromisoformat(incident["last_seen_at"]) == timedelta(minutes=30)
    clock.jump(15 * 60)  # half way through the wider pause: still waiting
    await service.settled()
    assert smtp_sink.messages == []

    clock.jump(15 * 60 + 1)
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"
    assert await incidents(account) == []
    assert (await account.client.get("/v1/suppressions/")).json()["items"] == []


async def test_a_mailbox_that_does_not_exist_still_bounces_and_is_suppressed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "people.example")
    smtp_sink.reply_for("gone@people.example", 550, "5.1.1 <gone@people.example>: user unknown")
    sent = (await account.client.post("/v1/emails/", json=message("gone@people.example"))).json()
    assert (await wait_for_status(account, sent["id"]))["status"] == "bounced"
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert [(s["email"], s["reason"]) for s in listed] == [("gone@people.example", "hard_bounce")]
    assert await incidents(account, "all") == []


async def test_incidents_are_the_workspaces_own_and_the_query_is_checked(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "slow.example")
    smtp_sink.fail_first("ann@slow.example", 1, code=421, text="4.7.0 Try again later")
    sent = (await account.client.post("/v1/emails/", json=message("ann@slow.example"))).json()
    await wait_for_status(account, sent["id"], ("deferred",))
    [incident] = await incidents(account)
    assert incident["kind"] == "rate_limited"
    # The console's overview shows it to the workspace's people.
    browser = service.client()
    signed_in = await browser.post(
        "/v1/auth/login", json={"email": account.email, "password": account.password}
    )
    assert signed_in.status_code == 200
    page = (await browser.get("/")).text
    assert "Destination incidents" in page
    assert "slow.example" in page and "rate_limited" in page and "4.7.0 Try again later" in page
    stranger = await service.account("starter")
    assert await incidents(stranger, "all") == []
    for params in ({"status": "closed"}, {"limit": "0"}, {"limit": "201"}):
        response = await account.client.get("/v1/delivery/incidents", params=params)
        assert response.status_code == 422, params
        assert response.json()["code"] == "validation_error"


@pytest.mark.parametrize(
    ("kind", "pauses"),
    [
        ("rate_limited", [1, 2, 4, 8, 16, 32, 60, 60]),
        ("blocked", [15, 30, 60, 120, 240, 240]),
        ("dns", [1, 2, 4, 8, 16, 30]),
    ],
)
def test_the_pause_widens_on_each_repeat_up_to_its_ceiling(kind: str, pauses: list[int]) -> None:
    assert [pause_for(kind, strikes) for strikes in range(1, len(pauses) + 1)] == [
        timedelta(minutes=m) for m in pauses
    ]
    assert pause_for(kind, 10_000) == timedelta(minutes=pauses[-1])


async def test_a_person_resolves_an_incident_and_the_paused_mail_goes_at_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "blocked.example")
    smtp_sink.fail_first("ann@blocked.example", 1, code=550, text=REPUTATION_BLOCK)
    first = (await account.client.post("/v1/emails/", json=message("ann@blocked.example"))).json()
    await wait_for_status(account, first["id"], ("deferred",))
    [incident] = await incidents(account)
    waiting = (await account.client.post("/v1/emails/", json=message("bob@blocked.example"))).json()
    await service.settled()
    assert smtp_sink.messages == []

    resolve = f"/v1/delivery/incidents/{incident['id']}/resolve"
    stranger = await service.account("starter")
    assert (await stranger.client.post(resolve)).status_code == 404
    resolved = await account.client.post(resolve)
    assert resolved.status_code == 200, resolved.text
    assert (resolved.json()["status"], resolved.json()["id"]) == ("resolved", incident["id"])
    # Mail paused behind it goes without waiting out the pause (the clock stands still).
    assert (await wait_for_status(account, waiting["id"]))["status"] == "delivered"
    again = await account.client.post(resolve)
    assert again.status_code == 409 and again.json()["code"] == "incident_resolved"
    assert await incidents(account) == []
    log = (await account.client.get("/v1/audit-log", params={"category": "Send"})).json()
    assert "delivery_incident.resolved" in [e["action"] for e in log["items"]]
