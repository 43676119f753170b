"""The MCP door as tests use it: the SDK's client on /mcp with an API key, a tool call that
must succeed or must be refused, a person's session to change the MCP policy, the audit log,
and an email draft."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import mcp_types as types
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from tests.harness.sending import SENDER
from tests.harness.service import PUBLIC_URL, Account, Service


@asynccontextmanager
async def mcp_client(
    service: Service, api_key: str, name: str = "test-agent", mode: str = "auto"
) -> AsyncIterator[Client]:
    """The SDK's client on the service's /mcp, with an API key as Bearer."""
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {api_key}"})
    transport = streamable_http_client(f"{service.url}/mcp", http_client=http)
    info = types.Implementation(name=name, version="1.0")
    async with http, Client(transport, client_info=info, mode=mode) as client:
        yield client


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer; the test fails on a tool error."""
    result = await client.call_tool(tool, arguments)
    assert not result.is_error, result.structured_content
    body: dict[str, Any] = result.structured_content
    return body


async def refused(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """The error body of a call that must fail."""
    result = await client.call_tool(tool, arguments)
    assert result.is_error, result.structured_content
    body: dict[str, Any] = result.structured_content
    assert set(body) >= {"code", "detail"}
    return body


async def logged_in(service: Service, account: Account) -> httpx.AsyncClient:
    """A person's client: the session cookie and the public URL as Origin."""
    client = service.client(headers={"Origin": PUBLIC_URL})
    credentials = {"email": account.email, "password": account.password}
    assert (await client.post("/v1/auth/login", json=credentials)).status_code == 200
    return client


async def set_policy(service: Service, account: Account, **change: Any) -> dict[str, Any]:
    person = await logged_in(service, account)
    response = await person.patch("/v1/mcp/policy", json=change)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def activity(account: Account) -> list[dict[str, Any]]:
    response = await account.client.get("/v1/audit-log", params={"range": "24h"})
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def draft(to: list[str], **extra: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "from_": {"email": SENDER, "name": "Hello"},
        "to": [{"email": address} for address in to],
        "subject": "Your receipt",
        "text": "Thanks for your order.",
    }
    return {**body, **extra}
