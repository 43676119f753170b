"""The activity log: `GET /v1/audit-log` ordering, ranges, categories, limit, isolation, shape."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

import httpx
import pytest
import trio
from trio.testing import MockClock

from engine.accounts import users as accounts
from tests.harness.service import Account, Service

DAY = 24 * 60 * 60
ENTRY_FIELDS = {
    "id",
    "actor",
    "action",
    "target_type",
    "target_name",
    "target_id",
    "category",
    "meta",
    "created_at",
}


async def advance(clock: MockClock, seconds: float) -> None:
    """Move the service's time forward and let its tasks notice before the next request.

    The test must take the `clock` fixture as an argument: pytest-trio runs the test under a
    clock only when the test itself asks for it.
    """
    clock.jump(seconds)
    await trio.sleep(0.01)


def unpooled(service: Service, account: Account) -> httpx.AsyncClient:
    """A client for the account that opens a new connection per request.

    Keep-alive connections do not survive a jump of the clock by more than a minute (the
    server stops answering on them), so tests that jump use this client.
    """
    return service.client(
        headers={"Authorization": f"Bearer {account.api_key}"},
        limits=httpx.Limits(max_keepalive_connections=0),
    )


async def create_keys(client: httpx.AsyncClient, *names: str) -> list[str]:
    """Create API keys (one Security entry each); their ids."""
    ids = []
    for name in names:
        response = await client.post("/v1/api-keys/", json={"name": name})
        assert response.status_code == 201, response.text
        ids.append(response.json()["id"])
    return ids


async def create_domain(client: httpx.AsyncClient, name: str) -> str:
    """Register a domain (one Domain entry); its id."""
    response = await client.post("/v1/domains/", json={"name": name})
    assert response.status_code == 201, response.text
    domain_id: str = response.json()["id"]
    return domain_id


async def audit_log(client: httpx.AsyncClient, **params: str | int) -> dict[str, Any]:
    response = await client.get("/v1/audit-log", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def parse_time(value: str) -> datetime:
    assert value.endswith("Z"), value
    return datetime.fromisoformat(value)


async def test_entries_are_listed_newest_first(service: Service, clock: MockClock) -> None:
    account = await service.account("pro")  # logs the creation of its first key
    await advance(clock, 5)
    (first_key,) = await create_keys(account.client, "first")
    await advance(clock, 5)
    domain_id = await create_domain(account.client, "newest-first.example")
    await advance(clock, 5)
    (last_key,) = await create_keys(account.client, "last")

    items = (await audit_log(account.client))["items"]

    assert [(i["action"], i["target_id"]) for i in items[:3]] == [
        ("api_key.created", last_key),
        ("domain.created", domain_id),
        ("api_key.created", first_key),
    ]
    assert items[3]["action"] == "api_key.created"
    assert items[3]["target_name"] == "default"
    times = [parse_time(i["created_at"]) for i in items]
    assert times == sorted(times, reverse=True)
    assert len(set(times)) == len(times)


async def test_range_selects_entries_by_age(service: Service, clock: MockClock) -> None:
    account = await service.account("pro")  # 1 entry, 100 days old by the end
    client = unpooled(service, account)
    await advance(clock, 15 * DAY)
    await create_keys(client, "85-days-old")
    await advance(clock, 65 * DAY)
    await create_keys(client, "20-days-old-a", "20-days-old-b")
    await advance(clock, 17 * DAY)
    await create_keys(client, "3-days-old-a", "3-days-old-b", "3-days-old-c")
    await advance(clock, 3 * DAY - 3600)
    await create_keys(client, "1-hour-old-a", "1-hour-old-b", "1-hour-old-c", "1-hour-old-d")
    await advance(clock, 3600)

    expected = {"24h": 4, "7d": 7, "30d": 9, "90d": 10}
    for range_name, count in expected.items():
        page = await audit_log(client, range=range_name)
        assert page["range"] == range_name
        assert page["total"] == count, range_name
        assert len(page["items"]) == count, range_name
    newest_day = [i["target_name"] for i in (await audit_log(client, range="24h"))["items"]]
    assert sorted(newest_day) == ["1-hour-old-a", "1-hour-old-b", "1-hour-old-c", "1-hour-old-d"]
    oldest = (await audit_log(client, range="90d"))["items"][-1]
    assert oldest["target_name"] == "85-days-old"


async def test_range_defaults_to_30d(service: Service, clock: MockClock) -> None:
    account = await service.account("starter")
    client = unpooled(service, account)
    await advance(clock, 31 * DAY)
    (recent_key,) = await create_keys(client, "recent")

    page = await audit_log(client)

    assert page["range"] == "30d"
    assert page["total"] == 1
    assert [i["target_id"] for i in page["items"]] == [recent_key]
    assert (await audit_log(client, range="90d"))["total"] == 2


@pytest.mark.parametrize("spelling", ["security", "SECURITY", "Security", "sEcUrItY"])
async def test_category_is_case_insensitive_and_filters(service: Service, spelling: str) -> None:
    account = await service.account("pro")
    key_ids = await create_keys(account.client, "one", "two")
    domain_id = await create_domain(account.client, "category.example")

    page = await audit_log(account.client, category=spelling)

    assert page["total"] == 3  # the account's first key and the two above
    assert {i["category"] for i in page["items"]} == {"Security"}
    assert set(key_ids) <= {i["target_id"] for i in page["items"]}
    domain_page = await audit_log(
        account.client, category=spelling.lower().replace("security", "DOMAIN")
    )
    assert domain_page["total"] == 1
    assert [i["target_id"] for i in domain_page["items"]] == [domain_id]
    assert [i["category"] for i in domain_page["items"]] == ["Domain"]


async def test_category_without_entries_is_empty(service: Service) -> None:
    account = await service.account()
    page = await audit_log(account.client, category="team")
    assert page == {"items": [], "range": "30d", "total": 0}


async def test_plan_changes_are_logged_under_billing(service: Service) -> None:
    account = await service.account("free")
    await accounts.set_plan(service.running.runtime, account.email, "pro")

    page = await audit_log(account.client, category="billing")

    assert page["total"] == 1
    (entry,) = page["items"]
    assert entry["action"] == "workspace.plan_changed"
    assert entry["category"] == "Billing"
    assert entry["target_id"] == account.workspace_id
    assert entry["meta"] == {"from": "free", "to": "pro"}


async def test_limit_caps_items_but_not_total(service: Service, clock: MockClock) -> None:
    account = await service.account("pro")
    for name in ("a", "b", "c", "d"):
        await advance(clock, 1)
        await create_keys(account.client, name)

    capped = await audit_log(account.client, limit=2)
    assert capped["total"] == 5
    assert [i["target_name"] for i in capped["items"]] == ["d", "c"]
    assert len((await audit_log(account.client, limit=1))["items"]) == 1
    everything = await audit_log(account.client, limit=500)
    assert everything["total"] == 5
    assert len(everything["items"]) == 5
    category_capped = await audit_log(account.client, limit=3, category="Security", range="24h")
    assert category_capped["total"] == 5
    assert len(category_capped["items"]) == 3


@pytest.mark.parametrize(
    ("param", "value"),
    [
        ("limit", "0"),
        ("limit", "501"),
        ("limit", "-1"),
        ("limit", "abc"),
        ("limit", "2.5"),
        ("range", "1y"),
        ("range", "24H"),
        ("range", ""),
        ("category", "Marketing"),
        ("category", ""),
    ],
)
async def test_invalid_query_is_422(service: Service, param: str, value: str) -> None:
    account = await service.account()
    response = await account.client.get("/v1/audit-log", params={param: value})
    assert response.status_code == 422
    body = response.json()
    assert body["code"] == "validation_error"
    assert isinstance(body["detail"], str)
    assert ["query", param] in [error["loc"] for error in body["errors"]]


async def test_other_workspaces_entries_never_appear(service: Service) -> None:
    alice = await service.account("pro")
    bob = await service.account("pro")
    bob_keys = await create_keys(bob.client, "bob-key")
    bob_domain = await create_domain(bob.client, "bob.example")
    alice_keys = await create_keys(alice.client, "alice-key")

    for params in ({}, {"range": "90d"}, {"category": "Security"}, {"category": "Domain"}):
        page = await audit_log(alice.client, **params)
        targets = {i["target_id"] for i in page["items"]}
        assert not targets & {*bob_keys, bob_domain}
        assert {i["actor"] for i in page["items"]} <= {alice.email}
        assert page["total"] == len(page["items"])
    assert set(alice_keys) <= {i["target_id"] for i in (await audit_log(alice.client))["items"]}
    assert (await audit_log(bob.client))["total"] == 3


async def test_entries_have_exactly_the_spec_fields(service: Service) -> None:
    account = await service.account()
    domain_id = await create_domain(account.client, "Fields.Example")

    (entry,) = (await audit_log(account.client, category="Domain"))["items"]

    assert set(entry) == ENTRY_FIELDS
    assert str(uuid.UUID(entry["id"])) == entry["id"]
    assert entry["actor"] == account.email
    assert entry["action"] == "domain.created"
    assert entry["target_type"] == "Domain"
    assert entry["target_name"] == "fields.example"
    assert entry["target_id"] == domain_id
    assert entry["category"] == "Domain"
    assert entry["meta"] == {}
    created_at = parse_time(entry["created_at"])
    assert abs((created_at - service.running.runtime.clock.now()).total_seconds()) < 60
