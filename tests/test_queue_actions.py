"""Queue actions by search (`POST /v1/queue/actions`): hold, release, cancel and retry now the
mail an email-log search matches, on both engines, against the SMTP sink; a dry run touches
nothing, another workspace's mail is never touched, and bad requests are 422s."""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

OTHER_DOMAIN = "mail.other.example"


async def other_account(service: Service, dns_server: DnsServer) -> Account:
    """A second workspace with a verified domain of its own and a sender on it."""
    account = await service.account("starter")
    domain = (await account.client.post("/v1/domains/", json={"name": OTHER_DOMAIN})).json()
    dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    assert (await account.client.post(f"/v1/domains/{domain['id']}/verify")).json()[
        "status"
    ] == "verified"
    created = await account.client.post("/v1/senders/", json={"email": f"hi@{OTHER_DOMAIN}"})
    assert created.status_code == 201
    return account


async def deferred(account: Account, smtp_sink: SmtpSink, to: str, **extra: Any) -> str:
    """An email to `to` whose first attempt got a 451: deferred, next try in a minute."""
    smtp_sink.fail_first(to, 1, code=451)
    sent = await account.client.post("/v1/emails/", json=message(to, **extra))
    assert sent.status_code == 202, sent.text
    await wait_for_status(account, sent.json()["id"], ("deferred",))
    return str(sent.json()["id"])


async def act(account: Account, q: str, action: str, dry_run: bool = False) -> dict[str, Any]:
    response = await account.client.post(
        "/v1/queue/actions", json={"q": q, "action": action, "dry_run": dry_run}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def queue_entries(account: Account) -> list[dict[str, Any]]:
    items = (await account.client.get("/v1/audit-log")).json()["items"]
    return [i for i in items if i["action"].startswith("queue.")]


def delivered_to(smtp_sink: SmtpSink) -> list[str]:
    return [address for m in smtp_sink.messages for address in m.rcpt_to]


async def test_hold_then_release_by_search_and_held_mail_waits_meanwhile(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "outlook.example")
    route_mail(dns_server, "other.example")
    held_id = await deferred(account, smtp_sink, "ann@outlook.example")
    other_id = await deferred(account, smtp_sink, "bob@other.example")

    q = "destination:outlook.example status:deferred"
    assert await act(account, q, "hold") == {
        "action": "hold",
        "dry_run": False,
        "emails": 1,
        "recipients": 1,
    }
    email = (await account.client.get(f"/v1/emails/{held_id}")).json()
    assert email["status"] == "held"
    assert [r["status"] for r in email["recipients"]] == ["held"]
    assert email["events"][-1]["event_type"] == "held"
    listed = (await account.client.get("/v1/emails/", params={"status": "held"})).json()
    assert [e["id"] for e in listed] == [held_id]
    found = (await account.client.get("/v1/emails/search", params={"q": "status:held"})).json()
    assert [e["id"] for e in found] == [held_id]

    clock.jump(3600)  # both retries were due long ago: only the one not held goes out
    assert (await wait_for_status(account, other_id))["status"] == "delivered"
    await service.settled()
    assert delivered_to(smtp_sink) == ["bob@other.example"]
    assert (await account.client.get(f"/v1/emails/{held_id}")).json()["status"] == "held"

    released = await act(account, "status:held", "release")
    assert (released["emails"], released["recipients"]) == (1, 1)
    assert (await wait_for_status(account, held_id))["status"] == "delivered"
    assert sorted(delivered_to(smtp_sink)) == ["ann@outlook.example", "bob@other.example"]
    entries = await queue_entries(account)
    assert [(e["action"], e["category"], e["meta"]["recipients"]) for e in entries] == [
        ("queue.released", "Send", 1),
        ("queue.held", "Send", 1),
    ]
    assert entries[1]["meta"]["q"] == q


async def test_a_dry_run_counts_and_touches_nothing(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "outlook.example")
    first = await deferred(account, smtp_sink, "ann@outlook.example")
    second = await deferred(account, smtp_sink, "bob@outlook.example")

    for action in ("hold", "cancel", "retry_now"):
        counted = await act(account, "status:deferred", action, dry_run=True)
        assert counted == {"action": action, "dry_run": True, "emails": 2, "recipients": 2}
    # Nothing held yet: a release would take nothing.
    assert (await act(account, "status:deferred", "release", dry_run=True))["recipients"] == 0
    for email_id in (first, second):
        email = (await account.client.get(f"/v1/emails/{email_id}")).json()
        assert email["status"] == "deferred"
        assert email["events"][-1]["event_type"] == "deferred"
    assert await queue_entries(account) == []
    assert smtp_sink.messages == []


async def test_cancel_by_search_takes_only_the_callers_mail(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    mine = await ready_account(service, dns_server)
    theirs = await other_account(service, dns_server)
    route_mail(dns_server, "outlook.example")
    kept = await deferred(mine, smtp_sink, "ann@outlook.example")
    cancelled = await deferred(
        theirs, smtp_sink, "bob@outlook.example", from_={"email": f"hi@{OTHER_DOMAIN}"}
    )

    touched = await act(theirs, "destination:outlook.example", "cancel")
    assert (touched["emails"], touched["recipients"]) == (1, 1)
    email = (await theirs.client.get(f"/v1/emails/{cancelled}")).json()
    assert email["status"] == "cancelled"
    assert [r["status"] for r in email["recipients"]] == ["cancelled"]
    # The other workspace's matching mail stays as it was, and goes out on its retry.
    assert (await mine.client.get(f"/v1/emails/{kept}")).json()["status"] == "deferred"
    clock.jump(120)
    assert (await wait_for_status(mine, kept))["status"] == "delivered"
    await service.settled()
    assert delivered_to(smtp_sink) == ["ann@outlook.example"]
    assert (await theirs.client.get(f"/v1/emails/{cancelled}")).json()["status"] == "cancelled"
    # Nothing left to act on: a second cancel touches nothing.
    assert (await act(theirs, "destination:outlook.example", "cancel"))["recipients"] == 0


async def test_retry_now_sends_deferred_mail_at_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "outlook.example")
    email_id = await deferred(account, smtp_sink, "ann@outlook.example")
    touched = await act(account, "to:ann@outlook.example", "retry_now")
    assert (touched["emails"], touched["recipients"]) == (1, 1)
    # No clock jump: the retry a minute away was made due now.
    assert (await wait_for_status(account, email_id))["status"] == "delivered"
    assert [e["action"] for e in await queue_entries(account)] == ["queue.retried"]


BAD_REQUESTS: list[tuple[dict[str, Any], str]] = [
    ({"q": "", "action": "hold"}, "q"),
    ({"q": "   ", "action": "cancel"}, "q"),  # an empty search would take the whole queue
    ({"q": "status:sleeping", "action": "hold"}, "q"),
    ({"q": "status:deferred", "action": "delete"}, "action"),
    ({"q": "status:deferred"}, "action"),
    ({"action": "hold"}, "q"),
    ({"q": "status:deferred", "action": "hold", "dry_run": "perhaps"}, "dry_run"),
    ({"q": "x" * 1001, "action": "hold"}, "q"),
]


async def test_bad_requests_are_422_naming_the_field(service: Service) -> None:
    account = await service.account("starter")
    for body, field in BAD_REQUESTS:
        response = await account.client.post("/v1/queue/actions", json=body)
        assert response.status_code == 422, (body, response.text)
        error = response.json()
        assert error["code"] == "validation_error"
        assert any(field in e["loc"] for e in error["errors"]), (body, error)
    assert await queue_entries(account) == []
