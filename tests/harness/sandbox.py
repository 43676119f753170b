"""Sandbox mode as tests set it up: an administrator's account in the sandbox with a domain
the sandbox verified and a sender on it, and sending from that sender."""

from __future__ import annotations

from typing import Any

from tests.harness.sending import message
from tests.harness.service import Account, Service

DOMAIN = "shop.example"
SENDER = f"hello@{DOMAIN}"


async def sandbox_account(service: Service, plan: str = "starter") -> Account:
    """An administrator's account in sandbox mode, with a domain the sandbox verified (no DNS
    record published) and a sender on it."""
    account = await service.account(plan, admin=True)
    switched = await account.client.put("/v1/sandbox", json={"enabled": True})
    assert switched.status_code == 200 and switched.json()["enabled"] is True
    domain = (await account.client.post("/v1/domains/", json={"name": DOMAIN})).json()
    marked = await account.client.post(f"/v1/sandbox/domains/{domain['id']}/verify")
    assert marked.status_code == 200 and marked.json()["status"] == "verified"
    assert (await account.client.post("/v1/senders/", json={"email": SENDER})).status_code == 201
    return account


def letter(to: str, **extra: Any) -> dict[str, Any]:
    return {**message(to), "from_": {"email": SENDER}, **extra}


async def send(account: Account, to: str, **extra: Any) -> str:
    sent = await account.client.post("/v1/emails/", json=letter(to, **extra))
    assert sent.status_code == 202, sent.text
    email_id: str = sent.json()["id"]
    return email_id
