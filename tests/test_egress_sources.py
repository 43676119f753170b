"""Egress sources and pools (issue 32, item 3), end to end on both engines: the operator's
API, and the delivery engine sending from 127.0.0.2, 127.0.0.3... (Linux routes all of
127/8 to the loopback interface, so binding them needs no setup) to the SMTP sink, which
records the address and EHLO name each message came with."""

from __future__ import annotations

from collections import Counter
from datetime import datetime, timedelta
from functools import partial
from typing import Any

import httpx
import trio
from trio.testing import MockClock

from engine.delivery import egress_sources
from postroom.service import RunningService, serve
from storage import egress
from storage.egress import Member, Pool
from tests.harness import service as harness
from tests.harness.api import assert_error
from tests.harness.clock import minute_after, move_to, now
from tests.harness.dns_server import DnsServer
from tests.harness.egress import POOLS, SOURCES, assign_pool, create_pool, create_source
from tests.harness.sending import (
    message,
    only_domain_id,
    ready_account,
    route_mail,
    schedule,
    settled,
    wait_for_status,
)
from tests.harness.service import Service
from tests.harness.smtp_sink import ReceivedMessage, SmtpSink


async def _expected(service: Service, pool_id: str, ids: dict[str, str]) -> dict[str, str]:
    """The bind address each recipient's email should leave from, by the pure selection."""

    def read(tx: Any) -> tuple[Pool | None, dict[str, egress.Source]]:
        pool = egress.get_pool(tx, pool_id)
        assert pool is not None
        return pool, egress.sources_of(tx, (m.source_id for m in pool.sources))

    pool, sources = await service.running.runtime.db.read(read)
    assert pool is not None
    chosen = {a: egress_sources.choose(pool, sources, i) for a, i in ids.items()}
    return {a: s.bind_address for a, s in chosen.items() if s is not None}


def _by_recipient(messages: list[ReceivedMessage]) -> dict[str, ReceivedMessage]:
    return {m.rcpt_to[0]: m for m in messages}


def test_a_pool_chooses_by_weight_and_the_same_source_for_an_email_every_time() -> None:
    now = datetime(2026, 1, 1)
    sources = {
        i: egress.Source(i, i, f"127.0.0.{n}", f"{i}.example", now, now)
        for n, i in ((2, "a"), (3, "b"), (4, "gone"))
    }
    pool = Pool("p", "p", (Member("a", 3), Member("b", 1)), now, now)
    chosen = [egress_sources.choose(pool, sources, f"email-{n}") for n in range(4000)]
    picks = Counter(s.id if s else None for s in chosen)
    assert 2800 <= picks["a"] <= 3200 and picks["a"] + picks["b"] == 4000, picks
    assert egress_sources.choose(pool, sources, "x") == egress_sources.choose(pool, sources, "x")
    only_gone = Pool("q", "q", (Member("missing", 5),), now, now)
    assert egress_sources.choose(only_gone, sources, "x") is None


async def test_egress_sources_and_pools_api_and_its_errors(service: Service) -> None:
    admin = await service.account(admin=True)
    user = await service.account()
    assert_error(await user.client.get(SOURCES), 403, "admin_required")
    assert_error(
        await user.client.post(
            SOURCES, json={"name": "a", "bind_address": "127.0.0.2", "ehlo_name": "a.example"}
        ),
        403,
        "admin_required",
    )
    for bad, field in (
        ({"name": "a", "bind_address": "not-an-ip", "ehlo_name": "a.example"}, "bind_address"),
        ({"name": "a", "bind_address": "224.0.0.1", "ehlo_name": "a.example"}, "bind_address"),
        ({"name": "a", "bind_address": "127.0.0.2", "ehlo_name": "has space.x"}, "ehlo_name"),
        ({"name": "a", "bind_address": "127.0.0.2", "ehlo_name": "localhost"}, "ehlo_name"),
        ({"bind_address": "127.0.0.2", "ehlo_name": "a.example"}, "name"),
        ({"name": "a", "bind_address": "127.0.0.2", "ehlo_name": "a.x", "port": 25}, "port"),
    ):
        response = await admin.client.post(SOURCES, json=bad)
        assert response.status_code == 422, (bad, response.text)
        body = response.json()
        assert body["code"] == "validation_error"
        assert any(field in error["loc"] for error in body["errors"]), body
    a = await create_source(admin, "a", "127.0.0.2")
    assert (a["bind_address"], a["ehlo_name"]) == ("127.0.0.2", "a.out.example.org")
    v6 = await create_source(admin, "v6", "0:0::1")
    assert v6["bind_address"] == "::1"  # canonical form
    again = await admin.client.post(
        SOURCES, json={"name": "a", "bind_address": "127.0.0.9", "ehlo_name": "z.example"}
    )
    assert_error(again, 409, "source_exists")
    changed = await admin.client.patch(f"{SOURCES}/{a['id']}", json={"ehlo_name": "A.Example."})
    assert changed.json()["ehlo_name"] == "a.example" and changed.json()["name"] == "a"
    assert (await admin.client.get(f"{SOURCES}/{a['id']}")).json() == changed.json()
    listed = (await admin.client.get(SOURCES)).json()["items"]
    assert [s["name"] for s in listed] == ["a", "v6"]
    assert_error(await admin.client.get(f"{SOURCES}/{'0' * 26}"), 404, "not_found")

    unknown = await admin.client.post(
        POOLS, json={"name": "p", "sources": [{"source_id": "0" * 26, "weight": 1}]}
    )
    assert unknown.status_code == 404, unknown.text
    bad_pools: tuple[tuple[dict[str, Any], str], ...] = (
        ({"name": "p", "sources": []}, "sources"),
        ({"name": "p", "sources": [{"source_id": a["id"], "weight": 0}]}, "weight"),
        ({"name": "p", "sources": [{"source_id": a["id"]}] * 2}, "sources"),
        ({"name": "p", "sources": [{"source_id": a["id"], "extra": 1}]}, "extra"),
    )
    for bad, field in bad_pools:
        response = await admin.client.post(POOLS, json=bad)
        assert response.status_code == 422, (bad, response.text)
        assert any(field in error["loc"] for error in response.json()["errors"]), response.text
    pool_id = await create_pool(admin, "p", (a, 3), (v6, 1))
    pool = (await admin.client.get(f"{POOLS}/{pool_id}")).json()
    assert sorted((m["source_id"], m["weight"]) for m in pool["sources"]) == sorted(
        [(a["id"], 3), (v6["id"], 1)]
    )
    assert_error(await admin.client.delete(f"{SOURCES}/{a['id']}"), 409, "source_in_use")
    narrowed = await admin.client.patch(
        f"{POOLS}/{pool_id}", json={"sources": [{"source_id": v6["id"], "weight": 2}]}
    )
    assert narrowed.json()["sources"] == [{"source_id": v6["id"], "weight": 2}]
    assert (await admin.client.delete(f"{SOURCES}/{a['id']}")).status_code == 204
    assert_error(await admin.client.delete(f"{SOURCES}/{a['id']}"), 404, "not_found")

    await assign_pool(admin, "workspace", user.workspace_id, pool_id)
    assert_error(await admin.client.delete(f"{POOLS}/{pool_id}"), 409, "pool_in_use")
    path = f"/v1/admin/workspaces/{user.workspace_id}/egress-pool"
    assert_error(await user.client.put(path, json={"pool_id": None}), 403, "admin_required")
    assert_error(await admin.client.put(path, json={"pool_id": "0" * 26}), 404, "not_found")
    missing = f"/v1/admin/domains/{'0' * 26}/egress-pool"
    assert_error(await admin.client.put(missing, json={"pool_id": pool_id}), 404, "not_found")
    assert (await admin.client.put(path, json={})).status_code == 422  # pool_id is required
    await assign_pool(admin, "workspace", user.workspace_id, None)
    assert (await admin.client.delete(f"{POOLS}/{pool_id}")).status_code == 204
    assert (await admin.client.get(POOLS)).json() == {"items": []}


async def test_changes_at_once_are_never_lost_and_never_revive_a_deleted_source(
    service: Service,
) -> None:
    admin = await service.account(admin=True)
    for n in range(8):
        source = await create_source(admin, f"s{n}", "127.0.0.2")
        path = f"{SOURCES}/{source['id']}"
        async with trio.open_nursery() as nursery:
            for change in ({"name": f"renamed{n}"}, {"ehlo_name": f"new{n}.example.org"}):
                nursery.start_soon(partial(admin.client.patch, path, json=change))
        both = (await admin.client.get(path)).json()
        assert (both["name"], both["ehlo_name"]) == (f"renamed{n}", f"new{n}.example.org")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(partial(admin.client.patch, path, json={"name": f"late{n}"}))
            nursery.start_soon(admin.client.delete, path)
        assert_error(await admin.client.get(path), 404, "not_found")
    assert (await admin.client.get(SOURCES)).json() == {"items": []}


async def test_a_weighted_pool_spreads_mail_over_its_sources_and_a_domain_pool_wins(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    admin = await service.account(admin=True)
    route_mail(dns_server, "spread.example")
    sent = await account.client.post("/v1/emails/", json=message("first@spread.example"))
    assert sent.status_code == 202, sent.text
    [only] = await smtp_sink.wait_for_messages(1)
    # Without a pool: the default egress, from the host's address with the SMTP host name.
    assert (only.peer, only.helo) == ("127.0.0.1", service.running.runtime.smtp_host)
    a, b = (
        await create_source(admin, "a", "127.0.0.2"),
        await create_source(admin, "b", "127.0.0.3"),
    )
    pool_id = await create_pool(admin, "spread", (a, 1), (b, 1))
    await assign_pool(admin, "workspace", account.workspace_id, pool_id)
    send_at = now(service) + timedelta(hours=1)
    addresses = [f"r{i}@spread.example" for i in range(20)]
    ids = dict(zip(addresses, await schedule(account, addresses, send_at), strict=True))
    move_to(service, clock, minute_after(send_at))
    received = _by_recipient((await smtp_sink.wait_for_messages(21, timeout=60))[1:])
    expected = await _expected(service, pool_id, ids)
    helo = {"127.0.0.2": "a.out.example.org", "127.0.0.3": "b.out.example.org"}
    # Each email left from the source chosen for it, on that source's own connection.
    assert {r: (m.peer, m.helo) for r, m in received.items()} == {
        r: (address, helo[address]) for r, address in expected.items()
    }
    assert set(expected.values()) == {"127.0.0.2", "127.0.0.3"}

    # The sending domain's pool wins over its workspace's.
    c = await create_source(admin, "c", "127.0.0.4")
    await assign_pool(
        admin, "domain", await only_domain_id(account), await create_pool(admin, "own", (c, 1))
    )
    send_at = now(service) + timedelta(hours=1)
    await schedule(account, [f"d{i}@spread.example" for i in range(3)], send_at)
    move_to(service, clock, minute_after(send_at))
    later = (await smtp_sink.wait_for_messages(24, timeout=60))[21:]
    assert {(m.peer, m.helo) for m in later} == {("127.0.0.4", "c.out.example.org")}


async def test_an_ipv6_source_sends_to_ipv6_addresses_only(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, nursery: trio.Nursery
) -> None:
    await nursery.start(smtp_sink.also_on, "::1")
    account = await ready_account(service, dns_server)
    admin = await service.account(admin=True)
    v6 = await create_source(admin, "v6", "::1")
    await assign_pool(
        admin, "workspace", account.workspace_id, await create_pool(admin, "v6", (v6, 1))
    )
    dns_server.set("dual.example", "MX", ["10 mx.dual.example."])
    dns_server.set("mx.dual.example", "A", ["127.0.0.1"])
    dns_server.set("mx.dual.example", "AAAA", ["::1"])
    route_mail(dns_server, "v4only.example")
    dual = await account.client.post("/v1/emails/", json=message("a@dual.example"))
    v4only = await account.client.post("/v1/emails/", json=message("b@v4only.example"))
    [received] = await smtp_sink.wait_for_messages(1)
    assert (received.peer, received.helo) == ("::1", "v6.out.example.org")
    assert (await wait_for_status(account, dual.json()["id"]))["status"] == "delivered"
    # Its MX host has only an IPv4 address: the IPv6 source cannot reach it, and says so.
    waiting = await wait_for_status(account, v4only.json()["id"], ("deferred",))
    [recipient] = waiting["recipients"]
    assert "mx.v4only.example has no IPv6 address" in recipient["last_response"]


async def test_a_new_source_warms_up_on_its_own(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    admin = await service.account(admin=True)
    route_mail(dns_server, "warm.example")
    domain_id = await only_domain_id(account)
    # A ramp of 2 on its first day, then 4; source a is as old as the ramp.
    today = now(service).date()
    created = await account.client.post(
        "/v1/delivery/ramps",
        json={
            "domain_id": domain_id,
            "first_day": 2,
            "factor": 2,
            "target_per_day": 1000,
            "starts_on": today.isoformat(),
        },
    )
    assert created.status_code == 201, created.text
    a = await create_source(admin, "a", "127.0.0.2")
    await assign_pool(
        admin, "workspace", account.workspace_id, await create_pool(admin, "old", (a, 1))
    )
    tomorrow = datetime.combine(today + timedelta(days=1), datetime.min.time(), now(service).tzinfo)
    send_at = tomorrow + timedelta(minutes=30)
    old = await schedule(account, [f"o{i}@warm.example" for i in range(6)], send_at)
    move_to(service, clock, send_at + timedelta(seconds=5))
    await smtp_sink.wait_for_messages(4)
    assert sorted(e["status"] for e in await settled(account, old)).count("delivered") == 4
    # Day two of the ramp: a's 4 are spent. A source made today starts on day one, with a
    # budget of its own: 2 more go, from it.
    b = await create_source(admin, "b", "127.0.0.3")
    await assign_pool(admin, "domain", domain_id, await create_pool(admin, "new", (b, 1)))
    send_at = now(service) + timedelta(minutes=10)
    new = await schedule(account, [f"n{i}@warm.example" for i in range(4)], send_at)
    move_to(service, clock, send_at + timedelta(seconds=5))
    await smtp_sink.wait_for_messages(6)
    statuses = [e["status"] for e in await settled(account, new)]
    assert sorted(statuses) == ["deferred", "deferred", "delivered", "delivered"]
    await trio.sleep(0.5)  # room for a message over the budget to arrive
    assert Counter(m.peer for m in smtp_sink.messages) == {"127.0.0.2": 4, "127.0.0.3": 2}


async def test_a_pool_is_used_by_two_nodes_on_one_database(
    service: Service,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    clock: MockClock,
    nursery: trio.Nursery,
) -> None:
    settings = harness.test_settings(database_url, dns_server, delivery_port=str(smtp_sink.port))
    second: RunningService = await nursery.start(serve, settings)
    try:
        account = await ready_account(service, dns_server, plan="business")
        admin = await service.account(admin=True)
        route_mail(dns_server, "nodes.example")
        a, b = (
            await create_source(admin, "a", "127.0.0.2"),
            await create_source(admin, "b", "127.0.0.3"),
        )
        pool_id = await create_pool(admin, "both", (a, 2), (b, 1))
        await assign_pool(admin, "workspace", account.workspace_id, pool_id)
        send_at = (now(service) + timedelta(hours=1)).isoformat()
        headers = {"Authorization": f"Bearer {account.api_key}"}
        ids: dict[str, str] = {}
        async with httpx.AsyncClient(base_url=second.api_url, headers=headers) as other:
            for n, client in enumerate([account.client, other]):
                batch = [message(f"r{n}-{i}@nodes.example", send_at=send_at) for i in range(15)]
                sent = await client.post("/v1/emails/batch", json=batch)
                assert sent.status_code == 202, sent.text
                for body, email in zip(batch, sent.json(), strict=True):
                    ids[body["to"][0]["email"]] = email["id"]
        move_to(service, clock, minute_after(datetime.fromisoformat(send_at)))
        received = _by_recipient(await smtp_sink.wait_for_messages(30, timeout=60))
        expected = await _expected(service, pool_id, ids)
        assert {r: m.peer for r, m in received.items()} == expected
        assert set(expected.values()) == {"127.0.0.2", "127.0.0.3"}
    finally:
        second.stop()
