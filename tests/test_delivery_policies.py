"""Destination policies, warm-up ramps and the forecast (issue 19), end to end on both engines:
the API, the delivery engine against the SMTP sink and DNS server, in virtual time.

Mail is scheduled and then made due all at once by moving the clock to a known second of a
minute (or day), so which window a budget counts in never depends on the machine's speed.
"""

from __future__ import annotations

import uuid
from datetime import datetime, timedelta
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from engine.delivery import throttle
from engine.delivery.policies import BURST
from engine.platform.settings import Caps
from postroom import config
from postroom.service import RunningService, serve
from storage.tx import Tx
from tests.harness import service as harness
from tests.harness.broadcasts import body as bulk_body
from tests.harness.broadcasts import sender_id
from tests.harness.clock import minute_after, move_to, now
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.egress import assign_pool, create_pool, create_source
from tests.harness.policies import GROUPED, POLICIES, create_policy, group_by_mx, grouped_by_mx
from tests.harness.sending import (
    message,
    only_domain_id,
    ready_account,
    route_mail,
    schedule,
    settled,
    wait_for_email,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

RAMPS = "/v1/delivery/ramps"


def _throttled(email: dict[str, Any]) -> bool:
    [recipient] = email["recipients"]
    response = str(recipient["last_response"] or "")
    return email["status"] == "deferred" and response.startswith("throttled")


async def test_two_per_minute_delays_the_third_message_to_the_next_minute(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "paced.example")
    await create_policy(account, match="paced.example", per_minute=2)
    send_at = now(service) + timedelta(hours=1)
    ids = await schedule(account, [f"r{i}@paced.example" for i in range(3)], send_at)
    due = minute_after(send_at)
    move_to(service, clock, due)
    await smtp_sink.wait_for_messages(2)
    emails = await settled(account, ids)
    waiting = [e for e in emails if e["status"] == "deferred"]
    assert len(waiting) == 1 and _throttled(waiting[0])
    [recipient] = waiting[0]["recipients"]
    next_minute = due.replace(second=0) + timedelta(minutes=1)
    assert recipient["attempts"] == 0  # waiting for budget is not an attempt
    assert datetime.fromisoformat(recipient["next_attempt_at"]) == next_minute
    deferred = [e for e in waiting[0]["events"] if e["event_type"] == "deferred"]
    assert deferred[0]["metadata"]["reason"] == "throttled"
    assert "2 per minute" in deferred[0]["metadata"]["limit"]
    assert len(smtp_sink.messages) == 2
    move_to(service, clock, next_minute + timedelta(seconds=1))
    await smtp_sink.wait_for_messages(3)
    last = await wait_for_email(account, waiting[0]["id"], lambda e: e["status"] == "delivered")
    assert [e["event_type"] for e in last["events"]].count("deferred") == 1


async def test_a_connection_limit_of_one_holds_one_open_transaction(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    route_mail(dns_server, "single.example")
    await create_policy(account, match="single.example", max_connections=1)
    send_at = now(service) + timedelta(hours=1)
    batch = [message(f"r{i}@single.example", send_at=send_at.isoformat()) for i in range(24)]
    assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    move_to(service, clock, minute_after(send_at))
    await smtp_sink.wait_for_messages(24, timeout=60)
    assert smtp_sink.most_open_transactions == 1
    assert smtp_sink.connections == 1


async def test_messages_per_connection_opens_a_new_connection_after_each_share(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    route_mail(dns_server, "share.example")
    await create_policy(
        account, match="share.example", max_connections=1, messages_per_connection=5
    )
    send_at = now(service) + timedelta(hours=1)
    batch = [message(f"r{i}@share.example", send_at=send_at.isoformat()) for i in range(20)]
    assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    move_to(service, clock, minute_after(send_at))
    await smtp_sink.wait_for_messages(20, timeout=60)
    assert smtp_sink.connections == 4
    assert smtp_sink.most_open_transactions == 1


async def test_an_mx_suffix_rule_groups_two_domains_for_rate_and_connections(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    await group_by_mx(account, dns_server)
    send_at = now(service) + timedelta(hours=1)
    ids = await schedule(account, GROUPED, send_at)
    move_to(service, clock, minute_after(send_at))
    emails = await grouped_by_mx(account, smtp_sink, ids)
    assert sum(_throttled(e) for e in emails) == 1


async def test_a_rate_is_paced_across_two_nodes_on_one_database(
    service: Service,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    nursery: trio.Nursery,
) -> None:
    # A second node on the same database, in the same virtual time. Each accepts half the
    # mail (on SQLite each node delivers what it accepted; on PostgreSQL either may).
    settings = harness.test_settings(database_url, dns_server, delivery_port=str(smtp_sink.port))
    second: RunningService = await nursery.start(serve, settings)
    try:
        account = await ready_account(service, dns_server, plan="business")
        route_mail(dns_server, "busy.example")
        await create_policy(account, match="busy.example", per_minute=30)
        send_at = (now(service) + timedelta(hours=1)).isoformat()
        headers = {"Authorization": f"Bearer {account.api_key}"}
        async with httpx.AsyncClient(base_url=second.api_url, headers=headers) as other:
            for n, client in enumerate([account.client, other]):
                batch = [message(f"r{n}-{i}@busy.example", send_at=send_at) for i in range(30)]
                assert (await client.post("/v1/emails/batch", json=batch)).status_code == 202
        due = minute_after(datetime.fromisoformat(send_at))
        move_to(service, clock, due)
        # A burst of three, then one every 2 s (30 per minute) on the two nodes together:
        # about 13 in the first 20 s, where a fixed window let all 30 go at once.
        await smtp_sink.wait_for_messages(3, timeout=60)
        for step in range(10):
            clock.jump(2)
            await smtp_sink.wait_for_messages(4 + step, timeout=60)
        await trio.sleep(1)  # room for any message over the pace to arrive
        elapsed = (now(service) - due).total_seconds()
        assert 13 <= len(smtp_sink.messages) <= 3 + int(elapsed // 2), elapsed
    finally:
        second.stop()


async def test_claims_of_two_nodes_at_once_share_one_budget(
    service: Service, dns_server: DnsServer
) -> None:
    # The claim itself, run by two nodes side by side (on PostgreSQL in two transactions at
    # once; SQLite has one writer): each leases its own recipients, both spend one budget.
    account = await ready_account(service, dns_server, plan="business")
    # Room for both nodes' connections: the first keeps only one per email it may send.
    await create_policy(account, match="claimed.example", per_minute=10, max_connections=20)
    send_at = now(service) + timedelta(hours=1)
    for n in range(3):
        batch = [
            message(f"r{n}-{i}@claimed.example", send_at=send_at.isoformat()) for i in range(100)
        ]
        assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    when = minute_after(send_at)
    destination = throttle.Destination("claimed.example", ("mx.claimed.example",))
    claims: dict[str, throttle.Claimed] = {}

    async def claim(node: str) -> None:
        claims[node] = await service.running.runtime.db.write(
            throttle.claim, destination, None, 4, 0, node, when, when + timedelta(seconds=30),
            200, Caps(), False,  # not steered: these two nodes are not registered
        )  # fmt: skip

    async with trio.open_nursery() as nursery:
        for node in ("node-a", "node-b"):
            nursery.start_soon(claim, node)
    # The burst of the 10-per-minute pace (policies.BURST), not the whole minute's 10.
    assert sum(len(c.recipients) for c in claims.values()) == BURST

    def statuses(tx: Tx) -> dict[str, int]:
        rows = tx.all(
            "SELECT status, COUNT(*) AS n FROM email_recipients"
            " WHERE domain = 'claimed.example' GROUP BY status"
        )
        return {row["status"]: int(row["n"]) for row in rows}

    # Both claimed at once; the other 297 wait for their turn.
    assert await service.running.runtime.db.read(statuses) == {"queued": 3, "deferred": 297}


async def test_a_ramp_defers_the_excess_and_releases_it_the_next_day(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "warm.example")
    # The mail falls due in the first hour of a day that is the ramp's first: 2 that day,
    # then 4.
    start = (now(service) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    created = await account.client.post(
        RAMPS,
        json={
            "domain_id": await only_domain_id(account),
            "first_day": 2,
            "factor": 2,
            "target_per_day": 1000,
            "starts_on": start.date().isoformat(),
        },
    )
    assert created.status_code == 201, created.text
    send_at = start + timedelta(minutes=30)
    ids = await schedule(account, [f"r{i}@warm.example" for i in range(5)], send_at)
    move_to(service, clock, send_at + timedelta(seconds=5))
    await smtp_sink.wait_for_messages(2)
    emails = await settled(account, ids)
    waiting = [e for e in emails if e["status"] == "deferred"]
    assert len(waiting) == 3 and all(_throttled(e) for e in waiting)
    next_day = start + timedelta(days=1)
    for email in waiting:
        assert datetime.fromisoformat(email["recipients"][0]["next_attempt_at"]) == next_day
    ramp = (await account.client.get(RAMPS)).json()[0]
    assert (ramp["day"], ramp["today_per_destination"], ramp["complete"]) == (1, 2, False)
    move_to(service, clock, next_day + timedelta(seconds=5))
    await smtp_sink.wait_for_messages(5)
    for email in waiting:
        await wait_for_email(account, email["id"], lambda e: e["status"] == "delivered")


async def test_mail_held_by_a_ramp_past_72_hours_is_still_retried_not_failed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "slowramp.example")
    start = (now(service) + timedelta(days=1)).replace(hour=0, minute=0, second=0, microsecond=0)
    ramp = {
        "domain_id": await only_domain_id(account),
        "first_day": 1,
        "factor": 1,  # one a day, for good
        "target_per_day": 10,
        "starts_on": start.date().isoformat(),
    }
    assert (await account.client.post(RAMPS, json=ramp)).status_code == 201
    send_at = start + timedelta(minutes=30)
    addresses = [f"r{i}@slowramp.example" for i in range(5)]
    ids = await schedule(account, addresses, send_at)
    move_to(service, clock, send_at + timedelta(seconds=5))
    for day in range(1, 5):  # one leaves each day; the last on the fifth, 4 days in
        await smtp_sink.wait_for_messages(day)
        if day < 4:
            move_to(service, clock, start + timedelta(days=day, seconds=5))
    [last_id] = [e["id"] for e in await settled(account, ids) if e["status"] == "deferred"]
    last = (await account.client.get(f"/v1/emails/{last_id}")).json()
    smtp_sink.fail_first(last["recipients"][0]["address"], 1, code=451)
    move_to(service, clock, start + timedelta(days=4, seconds=5))
    # Its first real attempt gets a 451, more than 72 hours after it was queued: it is
    # retried (its 72 hours count from when the ramp let it go), not failed.
    last = await wait_for_email(account, last_id, lambda e: e["recipients"][0]["attempts"] == 1)
    assert last["status"] == "deferred"
    assert last["recipients"][0]["last_response"].startswith("451")
    # The 451 spent the day's one message, so its retry waits for the next day's.
    move_to(service, clock, now(service) + timedelta(minutes=1, seconds=1))
    waiting = await wait_for_email(account, last_id, _throttled)
    assert waiting["recipients"][0]["attempts"] == 1
    move_to(service, clock, start + timedelta(days=5, seconds=5))
    await wait_for_email(account, last_id, lambda e: e["status"] == "delivered")


async def test_operator_caps_apply_where_no_policy_limits(
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    nursery: trio.Nursery,
) -> None:
    settings = harness.test_settings(
        database_url, dns_server, delivery_port=str(smtp_sink.port), delivery_max_per_minute="2"
    )
    running: RunningService = await nursery.start(serve, settings)
    capped = Service(running, clock)
    try:
        account = await ready_account(capped, dns_server)
        route_mail(dns_server, "capped.example")
        send_at = now(capped) + timedelta(hours=1)
        ids = await schedule(account, [f"r{i}@capped.example" for i in range(3)], send_at)
        move_to(capped, clock, minute_after(send_at))
        await smtp_sink.wait_for_messages(2)
        waiting = [e for e in await settled(account, ids) if e["status"] == "deferred"]
        assert len(waiting) == 1 and _throttled(waiting[0])
        assert "(operator)" in waiting[0]["recipients"][0]["last_response"]
        caps = (await account.client.get(POLICIES)).json()["caps"]
        assert (caps["per_minute"], caps["max_connections"]) == (2, 20)
    finally:
        await capped.aclose()
        running.stop()


def test_a_bad_operator_cap_stops_start_up_naming_it() -> None:
    with pytest.raises(config.SettingsError, match="POSTROOM_DELIVERY_MAX_PER_MINUTE"):
        config.load({"POSTROOM_DELIVERY_MAX_PER_MINUTE": "ten"})
    with pytest.raises(config.SettingsError, match="POSTROOM_DELIVERY_MAX_CONNECTIONS"):
        config.load({"POSTROOM_DELIVERY_MAX_CONNECTIONS": ""})
    loaded = config.load({"POSTROOM_DELIVERY_MAX_PER_DAY": "5000"}).delivery_caps
    assert (loaded.per_day, loaded.per_minute, loaded.max_connections) == (5000, None, 20)


async def test_the_forecast_says_when_the_last_throttled_message_leaves(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    empty = (await account.client.get("/v1/delivery/forecast")).json()
    assert (empty["waiting"], empty["last_leaves_at"], empty["destinations"]) == (0, None, [])
    route_mail(dns_server, "backlog.example")
    await create_policy(account, match="backlog.example", per_minute=2)
    send_at = now(service) + timedelta(hours=1)
    ids = await schedule(account, [f"r{i}@backlog.example" for i in range(7)], send_at)
    due = minute_after(send_at)
    move_to(service, clock, due)
    await smtp_sink.wait_for_messages(2)
    await settled(account, ids)
    forecast = (await account.client.get("/v1/delivery/forecast")).json()
    assert forecast["waiting"] == 5
    [destination] = forecast["destinations"]
    assert destination["destination"] == "backlog.example"
    assert destination["domains"] == ["backlog.example"]
    assert destination["limits"][0] | {"source": None} == {
        "unit": "minute",
        "amount": 2,
        "used": 2,
        "source": None,
    }
    # 2 more in each of the next three minutes: the fifth leaves at the third's start.
    expected = due.replace(second=0) + timedelta(minutes=3)
    assert datetime.fromisoformat(destination["last_leaves_at"]) == expected
    assert datetime.fromisoformat(forecast["last_leaves_at"]) == expected
    # And so it does, minute by minute.
    for minute, delivered in ((1, 4), (2, 6), (3, 7)):
        move_to(service, clock, due.replace(second=1) + timedelta(minutes=minute))
        await smtp_sink.wait_for_messages(delivered)
        assert len(smtp_sink.messages) == delivered
    missing = await account.client.get(f"/v1/broadcasts/{ids[0]}/forecast")
    assert missing.status_code == 404


async def test_the_forecast_counts_each_egress_source_of_a_pool_on_its_own(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    admin = await service.account(admin=True)
    route_mail(dns_server, "daily.example")
    await create_policy(account, match="daily.example", per_day=1)
    # One at a time, each claimed in a round of its own, so that every one waiting is due
    # tomorrow: a round spreads its own waits over the days after (throttle.py `_spend`), and
    # the forecast reports the latest of those too. (Sent together, how many a round took
    # varied with the machine's load.)
    for i in range(9):
        response = await account.client.post("/v1/emails/", json=message(f"r{i}@daily.example"))
        await settled(account, [response.json()["id"]])
    assert len(smtp_sink.messages) == 1
    today = now(service).replace(hour=0, minute=0, second=0, microsecond=0)
    # One sender, one a day: the eighth waiting leaves eight days on.
    [alone] = (await account.client.get("/v1/delivery/forecast")).json()["destinations"]
    assert datetime.fromisoformat(alone["last_leaves_at"]) == today + timedelta(days=8)
    # From a pool of two sources, each with a budget of its own (today's untouched): four
    # each, the first of them today, the last three days on.
    sources = [await create_source(admin, name, f"127.0.0.{n}") for n, name in ((2, "a"), (3, "b"))]
    pool_id = await create_pool(admin, "two", *((source, 1) for source in sources))
    await assign_pool(admin, "workspace", account.workspace_id, pool_id)
    [pooled] = (await account.client.get("/v1/delivery/forecast")).json()["destinations"]
    assert datetime.fromisoformat(pooled["last_leaves_at"]) == today + timedelta(days=3)
    assert [(limit["unit"], limit["amount"], limit["used"]) for limit in pooled["limits"]] == [
        ("day", 1, 0),
        ("day", 1, 0),
    ]
    assert [limit["source"].rpartition(" ")[2] for limit in pooled["limits"]] == ["a", "b"]


async def test_the_forecast_waits_for_a_deferred_recipients_next_attempt(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    smtp_sink.fail_first("ann@later.example", 1)  # 451: tried again after a back-off
    sent = await account.client.post("/v1/emails/", json=message("ann@later.example"))
    assert sent.status_code == 202, sent.text
    email = await wait_for_email(
        account, sent.json()["id"], lambda e: e["recipients"][0]["status"] == "deferred"
    )
    next_attempt = datetime.fromisoformat(email["recipients"][0]["next_attempt_at"])
    assert next_attempt > now(service) + timedelta(seconds=30)
    forecast = (await account.client.get("/v1/delivery/forecast")).json()
    [destination] = forecast["destinations"]
    # No policy limits it and nothing was accepted lately: only the retry time bounds it.
    assert destination["limits"] == []
    assert datetime.fromisoformat(destination["last_leaves_at"]) == next_attempt
    assert datetime.fromisoformat(forecast["last_leaves_at"]) == next_attempt


async def test_a_broadcasts_forecast_counts_only_its_own_emails(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "fans.example")
    await create_policy(account, match="fans.example", per_day=1)
    contact_list = await create_list(account)
    for name in ("ann", "bob", "cy"):
        await add_contact(account, contact_list["id"], f"{name}@fans.example")
    sent = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json=bulk_body(contact_list["id"], await sender_id(account)),
    )
    assert sent.status_code == 200 and sent.json()["queued"] == 3, sent.text
    [broadcast] = (await account.client.get("/v1/broadcasts/")).json()

    async def waiting(**params: str) -> int:
        found = await account.client.get("/v1/delivery/forecast", params=params)
        assert found.status_code == 200
        return int(found.json()["waiting"])

    with trio.fail_after(15):  # one leaves today, two wait
        while True:
            if await waiting() == 2:
                break
            await trio.sleep(0.05)
    single = await account.client.post("/v1/emails/", json=message("dee@fans.example"))
    await wait_for_email(account, single.json()["id"], _throttled)
    assert await waiting() == 3
    assert await waiting(broadcast_id=broadcast["id"]) == 2
    on_broadcast = (await account.client.get(f"/v1/broadcasts/{broadcast['id']}/forecast")).json()
    assert (on_broadcast["waiting"], on_broadcast["broadcast_id"]) == (2, broadcast["id"])


async def test_policy_and_ramp_validation(service: Service, dns_server: DnsServer) -> None:
    account = await ready_account(service, dns_server)
    client = account.client
    for bad, field in (
        ({"match": "not a domain", "per_minute": 1}, "match"),
        ({"match": "*.", "per_minute": 1}, "match"),
        ({"match": "gmail.com", "per_minute": 0}, "per_minute"),
        ({"match": "gmail.com", "max_connections": 5000}, "max_connections"),
        ({"match": "gmail.com"}, "max_connections"),  # no limit at all
        ({"per_minute": 3}, "match"),
    ):
        response = await client.post(POLICIES, json=bad)
        assert response.status_code == 422, (bad, response.text)
        body = response.json()
        assert body["code"] == "validation_error"
        assert any(field in error["loc"] for error in body["errors"]), body
    unknown = await client.post(
        POLICIES, json={"match": "gmail.com", "per_minute": 1, "domain_id": str(uuid.uuid4())}
    )
    assert unknown.status_code == 404
    created = await create_policy(account, match="Gmail.COM", per_hour=100)
    assert created["match"] == "gmail.com" and created["builtin"] is False
    again = await client.post(POLICIES, json={"match": "gmail.com", "per_day": 5})
    assert (again.status_code, again.json()["code"]) == (409, "policy_exists")
    listed = (await client.get(POLICIES)).json()
    builtins = [p for p in listed["items"] if p["builtin"]]
    assert {"*.google.com", "*.outlook.com", "*.yahoodns.net", "*.icloud.com"} <= {
        p["match"] for p in builtins
    }
    google = next(p for p in builtins if p["match"] == "*.google.com")
    assert (await client.get(f"{POLICIES}/{google['id']}")).json() == google
    refused = await client.patch(f"{POLICIES}/{google['id']}", json={"per_minute": 1})
    assert (refused.status_code, refused.json()["code"]) == (409, "builtin_policy")
    cleared = await client.patch(f"{POLICIES}/{created['id']}", json={"per_hour": None})
    assert cleared.status_code == 422  # it would be left with no limit
    changed = await client.patch(f"{POLICIES}/{created['id']}", json={"per_day": 900})
    assert (changed.json()["per_hour"], changed.json()["per_day"]) == (100, 900)
    other = await service.account()
    assert (await other.client.get(f"{POLICIES}/{created['id']}")).status_code == 404
    assert (await other.client.delete(f"{POLICIES}/{created['id']}")).status_code == 404
    assert (await client.delete(f"{POLICIES}/{created['id']}")).status_code == 204
    domain_id = await only_domain_id(account)
    for bad, field in (
        (
            {"domain_id": domain_id, "first_day": 100, "factor": 0.5, "target_per_day": 900},
            "factor",
        ),
        ({"domain_id": domain_id, "first_day": 0, "target_per_day": 900}, "first_day"),
        ({"domain_id": domain_id, "first_day": 100, "target_per_day": 100}, "target_per_day"),
        ({"first_day": 100, "target_per_day": 900}, "domain_id"),
    ):
        response = await client.post(RAMPS, json=bad)
        assert response.status_code == 422, (bad, response.text)
        assert any(field in error["loc"] for error in response.json()["errors"])
    ramp = {"domain_id": domain_id, "first_day": 200, "target_per_day": 5000}
    made = await client.post(RAMPS, json=ramp)
    assert made.status_code == 201
    assert (made.json()["factor"], made.json()["today_per_destination"]) == (2.0, 200)
    twice = await client.post(RAMPS, json=ramp)
    assert (twice.status_code, twice.json()["code"]) == (409, "ramp_exists")
    nulled = await client.patch(f"{RAMPS}/{made.json()['id']}", json={"factor": None})
    assert nulled.status_code == 422
    log = (await client.get("/v1/audit-log", params={"category": "send"})).json()["items"]
    assert {"delivery_policy.created", "delivery_policy.deleted", "delivery_ramp.created"} <= {
        entry["action"] for entry in log
    }


async def _account_sending_from(service: Service, dns_server: DnsServer, domain: str) -> Account:
    """A Business account whose verified domain is `domain`, with a sender hello@ on it."""
    account = await service.account("business")
    created = (await account.client.post("/v1/domains/", json={"name": domain})).json()
    dkim = next(r for r in created["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    verified = await account.client.post(f"/v1/domains/{created['id']}/verify")
    assert verified.json()["status"] == "verified"
    sender = await account.client.post("/v1/senders/", json={"email": f"hello@{domain}"})
    assert sender.status_code == 201
    return account


async def test_one_workspaces_connection_limit_holds_its_own_mail_not_everyones(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    """Issue 28, item 9: the connection count was the smallest limit of a round's mail, so
    one tenant's `max_connections: 1` made everyone's mail to that destination go one by one."""
    strict = await _account_sending_from(service, dns_server, "strict.example.org")
    other = await _account_sending_from(service, dns_server, "other.example.org")
    route_mail(dns_server, "shared.example")
    await create_policy(strict, match="shared.example", max_connections=1)
    smtp_sink.data_delay = 0.2  # transactions overlap when connections run side by side
    send_at = now(service) + timedelta(hours=1)
    for account, domain, count in ((strict, "strict", 6), (other, "other", 12)):
        batch = [
            message(
                f"r{i}@shared.example",
                from_={"email": f"hello@{domain}.example.org"},
                send_at=send_at.isoformat(),
            )
            for i in range(count)
        ]
        assert (await account.client.post("/v1/emails/batch", json=batch)).status_code == 202
    move_to(service, clock, minute_after(send_at))

    await smtp_sink.wait_for_messages(18, timeout=60)

    assert smtp_sink.most_open_by_sender["strict.example.org"] == 1  # its own limit holds
    assert smtp_sink.most_open_by_sender["other.example.org"] > 1  # and is not the others'
