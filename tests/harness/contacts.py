"""Contact lists as tests set them up: a list, a contact on it, and an id no row has."""

from __future__ import annotations

from typing import Any

from tests.harness.service import Account

MISSING = "00000000-0000-0000-0000-000000000000"


async def create_list(account: Account, name: str = "Customers", **extra: Any) -> dict[str, Any]:
    response = await account.client.post("/v1/contacts/", json={"name": name, **extra})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def add_contact(account: Account, list_id: str, email: str, **extra: Any) -> dict[str, Any]:
    response = await account.client.post(
        f"/v1/contacts/{list_id}/contacts", json={"email": email, **extra}
    )
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body
