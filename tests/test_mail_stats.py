"""How mail is doing: rates per domain, tag and broadcast, and a broadcast's figures, from
real sends through the loopback sink and real tracking hits, opens and clicks by machines
(on delivery, HEAD, scanners, every link at once) told apart from people's."""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

import pytest
from trio.testing import MockClock

from engine.sending.tracking import Hit, audience
from tests.harness.broadcasts import body, parsed, part, sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.sending import (
    SENDING_DOMAIN,
    message,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

PUBLIC = "http://postroom.test"
READERS = "readers.example"
MAIL_APP = "Mozilla/5.0 (Macintosh; Intel Mac OS X 14_5) AppleWebKit/605.1.15 (KHTML, like Gecko)"
SCANNER = "Mozilla/5.0 (compatible; Barracuda Sentinel link protection)"
HTML = (
    '<p>Dear {{name}}, read <a href="https://example.com/one">one</a>'
    ' or <a href="https://example.com/two">two</a>.</p>'
)


async def _enable_tracking(account: Account) -> None:
    domain = (await account.client.get("/v1/domains/")).json()[0]
    patched = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"open_tracking": True, "click_tracking": True}
    )
    assert patched.status_code == 200


def _links(data: bytes) -> tuple[str, list[str]]:
    """The open pixel's and the tracked links' paths on the service."""
    html = part(parsed(data), "html")
    [pixel] = re.findall(r'<img src="([^"]+)"', html)
    links = [u for u in re.findall(r'<a href="([^"]+)"', html) if "/t/c/" in u]
    assert len(links) == 2
    return pixel.removeprefix(PUBLIC), [u.removeprefix(PUBLIC) for u in links]


async def _broadcast(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> tuple[Account, str, dict[str, tuple[str, list[str]]]]:
    """A broadcast delivered to ann, bob and dee and bounced by permfail-cy, and a receipt
    (tag `receipt`) delivered to eve: the broadcast's id and each reader's links."""
    account = await ready_account(service, dns_server)
    await _enable_tracking(account)
    route_mail(dns_server, READERS)
    list_id = (await create_list(account))["id"]
    for name in ("ann", "bob", "dee", "permfail-cy"):
        await add_contact(account, list_id, f"{name}@{READERS}", name=name)
    sent = await account.client.post(
        f"/v1/contacts/{list_id}/send",
        json=body(list_id, await sender_id(account), html=HTML, text="Dear {{name}}."),
    )
    assert sent.status_code == 200, sent.text
    receipt = await account.client.post(
        "/v1/emails/", json=message(f"eve@{READERS}", tags=["receipt"])
    )
    received = await smtp_sink.wait_for_messages(4)
    await wait_for_status(account, receipt.json()["id"])
    for item in (await account.client.get("/v1/emails/", params={"limit": 10})).json():
        await wait_for_status(account, item["id"])
    [broadcast] = (await account.client.get("/v1/broadcasts/")).json()
    links = {
        m.rcpt_to[0].partition("@")[0]: _links(m.data)
        for m in received
        if m.rcpt_to[0] != f"eve@{READERS}"
    }
    return account, broadcast["id"], links


async def _hit(service: Service, path: str, agent: str, method: str = "GET") -> None:
    client = service.client(headers={"User-Agent": agent})
    response = await client.request(method, path)
    assert response.status_code in (200, 302), response.text


def _verdicts(events: list[dict[str, Any]], kind: str) -> list[tuple[str, str | None]]:
    return [
        (e["metadata"]["audience"], e["metadata"].get("reason"))
        for e in events
        if e["event_type"] == kind
    ]


BROADCAST_FIGURES = {
    "sent": 4,
    "delivered": 3,
    "bounced": 1,
    "complained": 0,
    "opened": 1,
    "clicked": 2,
    "machine_opened": 2,
    "machine_clicked": 2,
    "delivery_rate": 0.75,
    "bounce_rate": 0.25,
    "complaint_rate": 0.0,
    "open_rate": 0.3333,
    "click_rate": 0.6667,
}


async def test_rates_count_people_and_machines_apart(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account, broadcast_id, links = await _broadcast(service, dns_server, smtp_sink)
    ann_pixel, ann_links = links["ann"]
    bob_pixel, bob_links = links["bob"]
    _, dee_links = links["dee"]
    # On arrival: a privacy proxy fetches ann's images, a gateway checks bob's.
    await _hit(service, ann_pixel, MAIL_APP)
    await _hit(service, bob_pixel, MAIL_APP, method="HEAD")
    await _hit(service, bob_links[0], SCANNER)
    clock.jump(120)
    # Later, people: ann reads and clicks; dee's message has every link followed at once.
    await _hit(service, ann_pixel, MAIL_APP)
    await _hit(service, ann_links[1], MAIL_APP)
    await _hit(service, dee_links[0], MAIL_APP)
    await _hit(service, dee_links[1], MAIL_APP)

    log = (await account.client.get("/v1/emails/", params={"limit": 10})).json()
    by_reader = {e["to_addresses"][0].partition("@")[0]: e["id"] for e in log}

    async def events(reader: str) -> list[dict[str, Any]]:
        found = await account.client.get(f"/v1/emails/{by_reader[reader]}/events")
        result: list[dict[str, Any]] = found.json()
        return result

    ann, bob, dee = await events("ann"), await events("bob"), await events("dee")
    assert _verdicts(ann, "opened") == [("machine", "fetched_on_delivery"), ("human", None)]
    assert _verdicts(ann, "clicked") == [("human", None)]
    assert _verdicts(bob, "opened") == [("machine", "head_request")]
    assert _verdicts(bob, "clicked") == [("machine", "scanner_user_agent")]
    assert _verdicts(dee, "clicked") == [("human", None), ("machine", "every_link_at_once")]
    # Only the verdict is kept: not the requester's address, not its user agent.
    for event in ann + bob + dee:
        assert not {"ip", "user_agent"} & set(event["metadata"])

    figures = await account.client.get(f"/v1/broadcasts/{broadcast_id}/stats")
    assert figures.status_code == 200
    assert figures.json() == BROADCAST_FIGURES

    by_broadcast = (await account.client.get("/v1/stats/rates", params={"by": "broadcast"})).json()
    assert by_broadcast["by"] == "broadcast" and by_broadcast["range"] == "7d"
    assert by_broadcast["groups"] == [{"key": broadcast_id, **BROADCAST_FIGURES}]

    by_tag = (
        await account.client.get("/v1/stats/rates", params={"by": "tag", "range": "24h"})
    ).json()
    assert [g["key"] for g in by_tag["groups"]] == ["news", "receipt"]
    assert by_tag["groups"][0] == {"key": "news", **BROADCAST_FIGURES}
    receipt = by_tag["groups"][1]
    assert (receipt["sent"], receipt["delivered"], receipt["delivery_rate"]) == (1, 1, 1.0)
    assert (receipt["opened"], receipt["open_rate"]) == (0, 0.0)

    [domain] = (await account.client.get("/v1/stats/rates")).json()["groups"]
    assert domain["key"] == SENDING_DOMAIN
    assert (domain["sent"], domain["delivered"], domain["bounced"]) == (5, 4, 1)
    assert (domain["delivery_rate"], domain["click_rate"]) == (0.8, 0.5)


async def test_a_range_without_mail_has_no_groups_and_rates_need_a_denominator(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account, _, _ = await _broadcast(service, dns_server, smtp_sink)
    clock.jump(2 * 86400)
    found = (await account.client.get("/v1/stats/rates", params={"range": "24h"})).json()
    assert found["groups"] == []
    week = (await account.client.get("/v1/stats/rates", params={"range": "7d"})).json()
    assert [g["key"] for g in week["groups"]] == [SENDING_DOMAIN]


@pytest.mark.parametrize(
    "query",
    [{"by": "recipient"}, {"range": "1y"}, {"since": "2026-01-01"}],
)
async def test_bad_queries_are_422(service: Service, query: dict[str, str]) -> None:
    account = await service.account()
    response = await account.client.get("/v1/stats/rates", params=query)
    assert response.status_code == 422
    assert response.json()["code"] == "validation_error"


async def test_another_workspaces_broadcast_has_no_figures(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    _, broadcast_id, _ = await _broadcast(service, dns_server, smtp_sink)
    stranger = await service.account()
    response = await stranger.client.get(f"/v1/broadcasts/{broadcast_id}/stats")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"


@pytest.mark.parametrize(
    ("hit", "since_delivery", "burst", "verdict"),
    [
        (Hit("GET", MAIL_APP), timedelta(minutes=5), False, ("human", None)),
        (Hit("GET", MAIL_APP), None, False, ("human", None)),
        (Hit("HEAD", MAIL_APP), timedelta(minutes=5), False, ("machine", "head_request")),
        (Hit("GET", "  "), timedelta(minutes=5), False, ("machine", "no_user_agent")),
        (Hit("GET", "curl/8.5.0"), timedelta(minutes=5), False, ("machine", "scanner_user_agent")),
        (Hit("GET", SCANNER), timedelta(minutes=5), False, ("machine", "scanner_user_agent")),
        (Hit("GET", MAIL_APP), timedelta(seconds=2), False, ("machine", "fetched_on_delivery")),
        (Hit("GET", MAIL_APP), timedelta(minutes=5), True, ("machine", "every_link_at_once")),
    ],
)
def test_what_a_request_shows_decides_who_made_it(
    hit: Hit, since_delivery: timedelta | None, burst: bool, verdict: tuple[str, str | None]
) -> None:
    assert audience(hit, since_delivery, burst) == verdict
