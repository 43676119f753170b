"""The suppression list: adding (idempotently), paging and searching, removing, isolation."""

from __future__ import annotations

from typing import Any

from trio.testing import MockClock

from tests.harness.service import Account, Service

SUPPRESSION_FIELDS = {"email", "reason", "created_at", "source_email_id"}


async def suppress(account: Account, email: str, reason: str = "manual") -> dict[str, Any]:
    response = await account.client.post(
        "/v1/suppressions/", json={"email": email, "reason": reason}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def listing(account: Account, **params: Any) -> dict[str, Any]:
    response = await account.client.get("/v1/suppressions/", params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_add_returns_201_with_the_entry(service: Service) -> None:
    account = await service.account()
    response = await account.client.post(
        "/v1/suppressions/", json={"email": "bob@example.com", "reason": "complaint"}
    )
    assert response.status_code == 201
    entry = response.json()
    assert set(entry) == SUPPRESSION_FIELDS
    assert entry["email"] == "bob@example.com"
    assert entry["reason"] == "complaint"
    assert entry["created_at"].endswith("Z")
    assert entry["source_email_id"] is None
    assert (await listing(account))["items"] == [entry]


async def test_every_reason_is_accepted_and_manual_is_the_default(service: Service) -> None:
    account = await service.account()
    for reason in ("hard_bounce", "complaint", "unsubscribe", "manual"):
        assert (await suppress(account, f"{reason}@example.com", reason))["reason"] == reason
    default = await account.client.post("/v1/suppressions/", json={"email": "x@example.com"})
    assert default.status_code == 201
    assert default.json()["reason"] == "manual"


async def test_adding_again_returns_200_and_keeps_the_first_entry(service: Service) -> None:
    account = await service.account()
    first = await suppress(account, "bob@example.com", "hard_bounce")
    again = await account.client.post(
        "/v1/suppressions/", json={"email": "bob@example.com", "reason": "manual"}
    )
    assert again.status_code == 200
    assert again.json() == first
    page = await listing(account)
    assert (page["total"], page["items"]) == (1, [first])


async def test_unknown_reason_is_422(service: Service) -> None:
    account = await service.account()
    for reason in ("spam", "", "bounce", 5, None, ["manual"]):
        response = await account.client.post(
            "/v1/suppressions/", json={"email": "bob@example.com", "reason": reason}
        )
        assert response.status_code == 422, reason
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"][0]["loc"] == ["body", "reason"]
    assert (await listing(account))["total"] == 0


async def test_invalid_address_is_422(service: Service) -> None:
    account = await service.account()
    for body in (
        {"email": "not-an-email"},
        {"email": "bob@"},
        {"email": "@example.com"},
        {"email": ""},
        {"email": 5},
        {},
    ):
        response = await account.client.post("/v1/suppressions/", json=body)
        assert response.status_code == 422, body
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"]
    assert (await listing(account))["total"] == 0


async def test_addresses_are_case_normalised(service: Service) -> None:
    account = await service.account()
    entry = await suppress(account, "Bob.Smith@Example.COM")
    assert entry["email"] == "bob.smith@example.com"

    again = await account.client.post("/v1/suppressions/", json={"email": "BOB.SMITH@example.com"})
    assert again.status_code == 200
    assert again.json() == entry
    assert (await listing(account, q="SMITH@EXAMPLE"))["items"] == [entry]

    assert (await account.client.delete("/v1/suppressions/bob.smith@EXAMPLE.com")).status_code == (
        204
    )
    assert (await listing(account))["total"] == 0


async def test_list_pages_newest_first(service: Service, clock: MockClock) -> None:
    account = await service.account()
    added = []
    for i in range(5):
        added.append(await suppress(account, f"user{i}@example.com"))
        service.clock.jump(1)
    newest_first = added[::-1]

    everything = await listing(account)
    assert everything == {"items": newest_first, "total": 5, "page": 0, "limit": 20}
    assert await listing(account, page=0, limit=2) == {
        "items": newest_first[:2],
        "total": 5,
        "page": 0,
        "limit": 2,
    }
    assert (await listing(account, page=1, limit=2))["items"] == newest_first[2:4]
    assert (await listing(account, page=2, limit=2))["items"] == newest_first[4:]
    past_the_end = await listing(account, page=3, limit=2)
    assert (past_the_end["items"], past_the_end["total"]) == ([], 5)
    assert (await listing(account, limit=100))["items"] == newest_first
    assert (await listing(account, limit=1))["items"] == newest_first[:1]


async def test_page_and_limit_out_of_range_are_422(service: Service) -> None:
    account = await service.account()
    for params in ({"limit": 0}, {"limit": 101}, {"limit": "ten"}, {"page": -1}, {"page": "x"}):
        response = await account.client.get("/v1/suppressions/", params=params)
        assert response.status_code == 422, params
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"]


async def test_q_filters_by_substring(service: Service, clock: MockClock) -> None:
    account = await service.account()
    alice = await suppress(account, "alice@example.com")
    await suppress(account, "bob@example.org")
    service.clock.jump(1)
    alicia = await suppress(account, "alicia@shop.example.net")

    found = await listing(account, q="ali")
    assert (found["items"], found["total"]) == ([alicia, alice], 2)
    assert (await listing(account, q="example.org"))["total"] == 1
    assert (await listing(account, q="Example.NET"))["items"] == [alicia]
    assert (await listing(account, q="nobody"))["items"] == []
    paged = await listing(account, q="ali", limit=1, page=1)
    assert (paged["items"], paged["total"]) == ([alice], 2)


async def test_q_matches_wildcard_characters_literally(service: Service) -> None:
    account = await service.account()
    underscored = await suppress(account, "first_last@example.com")
    await suppress(account, "firstxlast@example.com")
    percent = await suppress(account, "100%off@example.com")
    bang = await suppress(account, "wow!@example.com")

    assert (await listing(account, q="_"))["items"] == [underscored]
    assert (await listing(account, q="first_"))["items"] == [underscored]
    assert (await listing(account, q="%"))["items"] == [percent]
    assert (await listing(account, q="!"))["items"] == [bang]
    assert (await listing(account, q="!_"))["items"] == []


async def test_deleted_suppression_is_gone(service: Service) -> None:
    account = await service.account()
    await suppress(account, "bob+news@example.com", "unsubscribe")
    kept = await suppress(account, "carol@example.com")

    deleted = await account.client.delete("/v1/suppressions/bob+news@example.com")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert (await listing(account))["items"] == [kept]

    again = await account.client.delete("/v1/suppressions/bob+news@example.com")
    assert again.status_code == 404
    assert again.json()["code"] == "not_found"
    # Suppressing it anew is a fresh entry.
    fresh = await account.client.post(
        "/v1/suppressions/", json={"email": "bob+news@example.com", "reason": "manual"}
    )
    assert fresh.status_code == 201
    assert fresh.json()["reason"] == "manual"


async def test_removing_an_address_that_is_not_suppressed_is_404(service: Service) -> None:
    account = await service.account()
    for email in ("nobody@example.com", "not-an-email", "%00"):
        response = await account.client.delete(f"/v1/suppressions/{email}")
        assert response.status_code == 404, email
        assert response.json()["code"] == "not_found"


async def test_workspaces_do_not_see_each_others_suppressions(service: Service) -> None:
    alice = await service.account()
    bob = await service.account()
    alices = await suppress(alice, "shared@example.com", "complaint")

    assert await listing(bob) == {"items": [], "total": 0, "page": 0, "limit": 20}
    assert (await listing(bob, q="shared"))["items"] == []
    refused = await bob.client.delete("/v1/suppressions/shared@example.com")
    assert refused.status_code == 404
    # Bob's own entry for the same address is independent of Alice's.
    bobs = await suppress(bob, "shared@example.com", "manual")
    assert bobs["reason"] == "manual"
    assert (await bob.client.delete("/v1/suppressions/shared@example.com")).status_code == 204
    assert (await listing(alice))["items"] == [alices]


async def test_suppression_changes_are_in_the_activity_log(service: Service) -> None:
    account = await service.account()
    await suppress(account, "bob@example.com", "complaint")
    # Already suppressed: nothing changes, so nothing is logged.
    await account.client.post("/v1/suppressions/", json={"email": "bob@example.com"})
    await account.client.delete("/v1/suppressions/bob@example.com")

    items = (await account.client.get("/v1/audit-log", params={"category": "send"})).json()["items"]
    entries = [i for i in items if i["action"].startswith("suppression.")]
    assert [e["action"] for e in entries] == ["suppression.deleted", "suppression.created"]
    for entry in entries:
        assert entry["category"] == "Send"
        assert entry["target_type"] == "Suppression"
        assert entry["target_name"] == "bob@example.com"
        assert entry["actor"] == account.email
    assert entries[1]["meta"] == {"reason": "complaint"}
