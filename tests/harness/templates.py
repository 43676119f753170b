"""Templates as tests create them through the API."""

from __future__ import annotations

from typing import Any

from tests.harness.service import Account


async def create_template(account: Account, **fields: Any) -> dict[str, Any]:
    response = await account.client.post("/v1/templates/", json={"name": "Welcome", **fields})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body
