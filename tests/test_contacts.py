"""Contact lists and contacts: every status code of the Contacts group, limits, isolation."""

from __future__ import annotations

from typing import Any

from tests.harness.contacts import MISSING, add_contact, create_list
from tests.harness.service import Service

LIST_FIELDS = {"id", "name", "description", "icon_seed", "contact_count", "created_at"}
CONTACT_FIELDS = {"id", "email", "name", "metadata", "created_at"}


async def test_create_read_update_and_list(service: Service) -> None:
    account = await service.account()
    created = await account.client.post(
        "/v1/contacts/",
        json={"name": "Customers", "description": "Paying ones", "icon_seed": "abc"},
    )
    assert created.status_code == 201
    contact_list = created.json()
    assert set(contact_list) == LIST_FIELDS
    assert contact_list["contact_count"] == 0
    assert contact_list["description"] == "Paying ones"
    assert contact_list["icon_seed"] == "abc"
    assert contact_list["created_at"].endswith("Z")

    read = await account.client.get(f"/v1/contacts/{contact_list['id']}")
    assert read.status_code == 200
    assert read.json() == {**contact_list, "contacts": []}

    # Only supplied fields change; null clears a nullable field.
    patched = await account.client.patch(
        f"/v1/contacts/{contact_list['id']}", json={"name": "Clients", "icon_seed": None}
    )
    assert patched.status_code == 200
    assert patched.json() == {**contact_list, "name": "Clients", "icon_seed": None}
    unchanged = await account.client.patch(f"/v1/contacts/{contact_list['id']}", json={})
    assert unchanged.json() == patched.json()

    listed = await account.client.get("/v1/contacts/")
    assert listed.status_code == 200
    assert listed.json() == [patched.json()]


async def test_invalid_bodies_are_422(service: Service) -> None:
    account = await service.account("starter")
    for body in ({}, {"name": ""}, {"name": None}, {"name": "x" * 201}, {"name": 5}):
        response = await account.client.post("/v1/contacts/", json=body)
        assert response.status_code == 422, body
        assert response.json()["code"] == "validation_error"
    contact_list = await create_list(account)
    response = await account.client.patch(f"/v1/contacts/{contact_list['id']}", json={"name": None})
    assert response.status_code == 422
    invalid: list[dict[str, Any]] = [
        {},
        {"email": "not-an-email"},
        {"email": "a@b.example", "metadata": "text"},
        {"email": "a@b.example", "name": "n" * 201},
        {"email": "a@b.example", "metadata": {"big": "x" * 20_000}},
    ]
    for body in invalid:
        response = await account.client.post(
            f"/v1/contacts/{contact_list['id']}/contacts", json=body
        )
        assert response.status_code == 422, body
        assert response.json()["code"] == "validation_error"
    assert (await account.client.get("/v1/contacts/")).json()[0]["contact_count"] == 0


async def test_contacts_are_added_paged_and_removed(service: Service) -> None:
    account = await service.account()
    contact_list = await create_list(account)
    list_id = contact_list["id"]
    first = await add_contact(
        account, list_id, "Ann@Example.COM", name="Ann", metadata={"plan": "gold", "age": 41}
    )
    assert set(first) == CONTACT_FIELDS
    assert first["email"] == "ann@example.com"
    assert first["name"] == "Ann"
    assert first["metadata"] == {"plan": "gold", "age": 41}
    bare = await add_contact(account, list_id, "bob@example.com", name="  ")
    folded = await add_contact(account, list_id, "cy@example.com", name="Cy\r\nBcc:  x@y.z")
    assert folded["name"] == "Cy Bcc: x@y.z"  # a name must fit in a To: header
    await account.client.delete(f"/v1/contacts/{list_id}/contacts/{folded['id']}")
    assert bare["name"] is None and bare["metadata"] is None
    for i in range(3):
        await add_contact(account, list_id, f"c{i}@example.com")

    read = (await account.client.get(f"/v1/contacts/{list_id}")).json()
    assert read["contact_count"] == 5
    assert [c["email"] for c in read["contacts"]] == [
        "ann@example.com",
        "bob@example.com",
        "c0@example.com",
        "c1@example.com",
        "c2@example.com",
    ]
    assert read["contacts"][0] == first
    page = await account.client.get(f"/v1/contacts/{list_id}", params={"page": 1, "limit": 2})
    assert [c["email"] for c in page.json()["contacts"]] == ["c0@example.com", "c1@example.com"]
    beyond = await account.client.get(f"/v1/contacts/{list_id}", params={"page": 9, "limit": 2})
    assert beyond.json()["contacts"] == []
    for params in ({"limit": 0}, {"limit": 201}, {"page": -1}, {"limit": "x"}):
        response = await account.client.get(f"/v1/contacts/{list_id}", params=params)
        assert response.status_code == 422, params
    assert (
        await account.client.get(f"/v1/contacts/{list_id}", params={"limit": 200})
    ).status_code == 200

    deleted = await account.client.delete(f"/v1/contacts/{list_id}/contacts/{bare['id']}")
    assert deleted.status_code == 204 and deleted.content == b""
    again = await account.client.delete(f"/v1/contacts/{list_id}/contacts/{bare['id']}")
    assert again.status_code == 404
    read = (await account.client.get(f"/v1/contacts/{list_id}")).json()
    assert read["contact_count"] == 4
    assert "bob@example.com" not in [c["email"] for c in read["contacts"]]


async def test_same_email_twice_in_a_list_is_409(service: Service) -> None:
    account = await service.account("starter")
    first_list = await create_list(account, "One")
    second_list = await create_list(account, "Two")
    await add_contact(account, first_list["id"], "ann@example.com")
    for email in ("ann@example.com", "ANN@example.com"):
        response = await account.client.post(
            f"/v1/contacts/{first_list['id']}/contacts", json={"email": email}
        )
        assert response.status_code == 409, email
        assert response.json()["code"] == "contact_exists"
    # Another list may hold the same address.
    await add_contact(account, second_list["id"], "ann@example.com")
    read = (await account.client.get(f"/v1/contacts/{first_list['id']}")).json()
    assert read["contact_count"] == 1


async def test_deleting_a_list_removes_its_contacts(service: Service) -> None:
    account = await service.account()
    contact_list = await create_list(account)
    contact = await add_contact(account, contact_list["id"], "ann@example.com")
    deleted = await account.client.delete(f"/v1/contacts/{contact_list['id']}")
    assert deleted.status_code == 204
    assert (await account.client.get("/v1/contacts/")).json() == []
    for response in (
        await account.client.get(f"/v1/contacts/{contact_list['id']}"),
        await account.client.delete(f"/v1/contacts/{contact_list['id']}"),
        await account.client.delete(f"/v1/contacts/{contact_list['id']}/contacts/{contact['id']}"),
        await account.client.post(
            f"/v1/contacts/{contact_list['id']}/contacts", json={"email": "b@example.com"}
        ),
    ):
        assert response.status_code == 404
    # The free plan's one list is free again.
    await create_list(account, "Again")


async def test_plan_limits_are_403(service: Service) -> None:
    account = await service.account()  # free: 1 list, 1,000 contacts per list
    contact_list = await create_list(account)
    refused = await account.client.post("/v1/contacts/", json={"name": "Second"})
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"
    csv = "email\n" + "".join(f"u{i}@example.com\n" for i in range(999))
    uploaded = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/upload", files={"file": ("c.csv", csv)}
    )
    assert uploaded.json()["imported"] == 999
    await add_contact(account, contact_list["id"], "last@example.com")
    full = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/contacts", json={"email": "over@example.com"}
    )
    assert full.status_code == 403
    assert full.json()["code"] == "plan_limit"
    # Removing one makes room again.
    read = (await account.client.get(f"/v1/contacts/{contact_list['id']}")).json()
    await account.client.delete(
        f"/v1/contacts/{contact_list['id']}/contacts/{read['contacts'][0]['id']}"
    )
    await add_contact(account, contact_list["id"], "over@example.com")


async def test_another_workspaces_list_is_404(service: Service) -> None:
    owner = await service.account()
    stranger = await service.account()
    contact_list = await create_list(owner)
    contact = await add_contact(owner, contact_list["id"], "ann@example.com")
    list_path = f"/v1/contacts/{contact_list['id']}"
    for response in (
        await stranger.client.get(list_path),
        await stranger.client.patch(list_path, json={"name": "Mine"}),
        await stranger.client.delete(list_path),
        await stranger.client.post(f"{list_path}/contacts", json={"email": "b@example.com"}),
        await stranger.client.delete(f"{list_path}/contacts/{contact['id']}"),
        await stranger.client.post(
            f"{list_path}/upload", files={"file": ("c.csv", "email\nb@example.com\n")}
        ),
        await stranger.client.get(f"/v1/contacts/{MISSING}"),
        await stranger.client.get("/v1/contacts/not-a-uuid"),
    ):
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert (await stranger.client.get("/v1/contacts/")).json() == []
    read = (await owner.client.get(list_path)).json()
    assert read["name"] == "Customers" and read["contact_count"] == 1


async def test_unauthenticated_is_401(service: Service) -> None:
    client = service.client()
    for method, path in (
        ("GET", "/v1/contacts/"),
        ("POST", "/v1/contacts/"),
        ("GET", f"/v1/contacts/{MISSING}"),
        ("POST", f"/v1/contacts/{MISSING}/send"),
    ):
        response = await client.request(method, path)
        assert response.status_code == 401, path


async def test_changes_are_in_the_activity_log(service: Service) -> None:
    account = await service.account()
    contact_list = await create_list(account)
    contact = await add_contact(account, contact_list["id"], "ann@example.com")
    await account.client.post(
        f"/v1/contacts/{contact_list['id']}/upload",
        files={"file": ("c.csv", "email\nbob@example.com\n")},
    )
    await account.client.delete(f"/v1/contacts/{contact_list['id']}/contacts/{contact['id']}")
    await account.client.patch(f"/v1/contacts/{contact_list['id']}", json={"name": "Renamed"})
    await account.client.delete(f"/v1/contacts/{contact_list['id']}")
    items = (await account.client.get("/v1/audit-log", params={"category": "Send"})).json()["items"]
    assert [i["action"] for i in items] == [
        "contact_list.deleted",
        "contact_list.updated",
        "contact_list.contact_removed",
        "contact_list.imported",
        "contact_list.contact_added",
        "contact_list.created",
    ]
    for item in items:
        assert item["category"] == "Send"
        assert item["target_type"] == "Contact list"
        assert item["target_id"] == contact_list["id"]
        assert item["actor"] == account.email
    assert items[3]["meta"] == {"imported": 1, "skipped": 0, "errors": 0}
