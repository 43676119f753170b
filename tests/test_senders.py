"""Sender addresses: registered on a workspace's own domains, listed, deleted, isolated."""

from __future__ import annotations

from typing import Any

from tests.harness.service import Account, Service

SENDER_FIELDS = {"id", "email", "name", "domain_id", "is_active", "created_at"}


async def create_domain(account: Account, name: str = "example.com") -> dict[str, Any]:
    response = await account.client.post("/v1/domains/", json={"name": name})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def create_sender(account: Account, email: str, name: str | None = None) -> dict[str, Any]:
    response = await account.client.post("/v1/senders/", json={"email": email, "name": name})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def sender_emails(account: Account) -> list[str]:
    response = await account.client.get("/v1/senders/")
    assert response.status_code == 200
    return [s["email"] for s in response.json()]


async def test_create_returns_the_sender_on_the_workspace_domain(service: Service) -> None:
    account = await service.account()
    domain = await create_domain(account)
    response = await account.client.post(
        "/v1/senders/", json={"email": "Hello@Example.COM", "name": "Hello Team"}
    )
    assert response.status_code == 201
    sender = response.json()
    assert set(sender) == SENDER_FIELDS
    assert sender["email"] == "hello@example.com"
    assert sender["name"] == "Hello Team"
    assert sender["domain_id"] == domain["id"]
    assert sender["is_active"] is True
    assert sender["created_at"].endswith("Z")
    # The name is optional.
    bare = await account.client.post("/v1/senders/", json={"email": "noreply@example.com"})
    assert bare.status_code == 201
    assert bare.json()["name"] is None


async def test_sender_on_an_internationalised_domain_is_accepted(service: Service) -> None:
    account = await service.account()
    domain = await create_domain(account, "bücher.example")
    sender = await create_sender(account, "info@bücher.example")
    assert sender["domain_id"] == domain["id"]
    assert sender["email"] == "info@xn--bcher-kva.example"
    # Either spelling of the domain names the same sender.
    again = await account.client.post("/v1/senders/", json={"email": "INFO@xn--bcher-kva.example"})
    assert again.status_code == 409


async def test_address_on_a_domain_outside_the_workspace_is_422(service: Service) -> None:
    account = await service.account()
    other = await service.account()
    await create_domain(account, "example.com")
    await create_domain(other, "other.example")
    for email in (
        "hello@unregistered.example",
        "hello@other.example",  # another workspace's domain
        "hello@mail.example.com",  # a subdomain is a different domain
    ):
        response = await account.client.post("/v1/senders/", json={"email": email})
        assert response.status_code == 422, email
        assert response.json()["code"] == "unknown_domain"
    assert await sender_emails(account) == []


async def test_invalid_email_is_422(service: Service) -> None:
    account = await service.account()
    await create_domain(account)
    for body in (
        {"email": "not-an-email"},
        {"email": "hello@"},
        {"email": "@example.com"},
        {"email": "two@@example.com"},
        {"email": ""},
        {"email": 5},
        {"email": None},
        {},
        {"email": "x@example.com", "name": "n" * 201},
    ):
        response = await account.client.post("/v1/senders/", json=body)
        assert response.status_code == 422, body
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"]
    assert await sender_emails(account) == []


async def test_same_address_twice_is_409(service: Service) -> None:
    account = await service.account()
    await create_domain(account)
    first = await create_sender(account, "hello@example.com", "First")
    for email in ("hello@example.com", "HELLO@example.com"):
        response = await account.client.post("/v1/senders/", json={"email": email})
        assert response.status_code == 409, email
        assert response.json()["code"] == "sender_exists"
    listed = (await account.client.get("/v1/senders/")).json()
    assert listed == [first]


async def test_list_holds_the_workspaces_senders(service: Service) -> None:
    account = await service.account("starter")
    other = await service.account()
    await create_domain(account, "example.com")
    await create_domain(account, "example.org")
    first = await create_sender(account, "a@example.com", "A")
    second = await create_sender(account, "b@example.org")

    listed = await account.client.get("/v1/senders/")
    assert listed.status_code == 200
    assert listed.json() == [first, second]
    assert (await other.client.get("/v1/senders/")).json() == []


async def test_deleted_sender_is_gone(service: Service) -> None:
    account = await service.account()
    await create_domain(account)
    sender = await create_sender(account, "hello@example.com")
    kept = await create_sender(account, "support@example.com")

    deleted = await account.client.delete(f"/v1/senders/{sender['id']}")
    assert deleted.status_code == 204
    assert deleted.content == b""
    assert await sender_emails(account) == [kept["email"]]
    again = await account.client.delete(f"/v1/senders/{sender['id']}")
    assert again.status_code == 404
    assert again.json()["code"] == "not_found"
    # The address can be registered again.
    assert (await create_sender(account, "hello@example.com"))["id"] != sender["id"]


async def test_another_workspaces_sender_is_404(service: Service) -> None:
    owner = await service.account()
    stranger = await service.account()
    await create_domain(owner)
    sender = await create_sender(owner, "hello@example.com")

    response = await stranger.client.delete(f"/v1/senders/{sender['id']}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert await sender_emails(stranger) == []
    assert await sender_emails(owner) == ["hello@example.com"]


async def test_unknown_and_malformed_sender_ids_are_404(service: Service) -> None:
    account = await service.account()
    for sender_id in ("00000000-0000-0000-0000-000000000000", "not-a-uuid", "x" * 300):
        response = await account.client.delete(f"/v1/senders/{sender_id}")
        assert response.status_code == 404, sender_id
        assert response.json()["code"] == "not_found"


async def test_deleting_a_domain_removes_its_senders(service: Service) -> None:
    account = await service.account("starter")
    doomed = await create_domain(account, "example.com")
    await create_domain(account, "example.org")
    await create_sender(account, "a@example.com")
    await create_sender(account, "b@example.com")
    await create_sender(account, "c@example.org")

    assert (await account.client.delete(f"/v1/domains/{doomed['id']}")).status_code == 204
    assert await sender_emails(account) == ["c@example.org"]
    refused = await account.client.post("/v1/senders/", json={"email": "a@example.com"})
    assert refused.status_code == 422
    assert refused.json()["code"] == "unknown_domain"


async def test_sender_changes_are_in_the_activity_log(service: Service) -> None:
    account = await service.account()
    await create_domain(account)
    sender = await create_sender(account, "hello@example.com")
    await account.client.delete(f"/v1/senders/{sender['id']}")

    items = (await account.client.get("/v1/audit-log", params={"category": "Domain"})).json()[
        "items"
    ]
    entries = [i for i in items if i["action"].startswith("sender.")]
    assert [e["action"] for e in entries] == ["sender.deleted", "sender.created"]
    for entry in entries:
        assert entry["category"] == "Domain"
        assert entry["target_type"] == "Sender"
        assert entry["target_name"] == "hello@example.com"
        assert entry["target_id"] == sender["id"]
        assert entry["actor"] == account.email
