"""Domain transfers as tests set them up: a source with a verified domain and a target
account, a transfer initiated, and a wait until the timer has moved it."""

from __future__ import annotations

from typing import Any

import trio

from tests.harness.dns_server import DnsServer
from tests.harness.sending import only_domain_id, ready_account, route_mail
from tests.harness.service import Account, Service

DAY = 24 * 3600


async def setup(
    service: Service, dns_server: DnsServer, target_plan: str = "starter"
) -> tuple[Account, Account, str]:
    """A source with a verified domain and a sender, a target account, mail routed to both."""
    source = await ready_account(service, dns_server)
    target = await service.account(target_plan)
    route_mail(dns_server, "example.org")  # every test account's address is @example.org
    return source, target, await only_domain_id(source)


async def initiate(source: Account, target: Account, domain: str, **extra: Any) -> dict[str, Any]:
    response = await source.client.post(
        f"/v1/domains/{domain}/transfer", json={"target_email": target.email, **extra}
    )
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def wait_for_transfer(account: Account, transfer_id: str, status: str) -> dict[str, Any]:
    """Poll the initiator's outgoing list until the timer has moved the transfer."""
    with trio.fail_after(15):
        while True:
            for t in (await account.client.get("/v1/domain-transfers/outgoing")).json():
                if t["id"] == transfer_id and t["status"] == status:
                    return dict(t)
            await trio.sleep(0.05)
