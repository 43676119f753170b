"""Destination policies (delivery rules per recipient domain) as tests create them through
the API."""

from __future__ import annotations

from typing import Any

from tests.harness.service import Account

POLICIES = "/v1/delivery/policies"


async def create_policy(account: Account, **fields: Any) -> dict[str, Any]:
    response = await account.client.post(POLICIES, json=fields)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created
