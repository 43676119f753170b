"""Destination policies (delivery rules per recipient domain) as tests create them through
the API."""

from __future__ import annotations

from typing import Any

from tests.harness.dns_server import DnsServer
from tests.harness.sending import settled
from tests.harness.service import Account
from tests.harness.smtp_sink import SmtpSink

POLICIES = "/v1/delivery/policies"
# Two recipient domains hosted by one provider (MX hosts under grouped.test), and one email
# to each of these addresses: a rule on the suffix (`group_by_mx`) counts them together.
GROUPED = ["a@one.example", "b@one.example", "c@two.example", "d@two.example"]


async def create_policy(account: Account, **fields: Any) -> dict[str, Any]:
    response = await account.client.post(POLICIES, json=fields)
    assert response.status_code == 201, response.text
    created: dict[str, Any] = response.json()
    return created


async def group_by_mx(account: Account, dns_server: DnsServer) -> None:
    """one.example and two.example hosted under grouped.test, with the account's rule on
    that suffix: 3 messages a minute over one connection, both domains counted together."""
    for domain, host in (("one.example", "mx1.grouped.test"), ("two.example", "mx2.grouped.test")):
        dns_server.set(domain, "MX", [f"10 {host}."])
        dns_server.set(host, "A", ["127.0.0.1"])
    await create_policy(account, match="*.grouped.test", per_minute=3, max_connections=1)


async def grouped_by_mx(
    account: Account, smtp_sink: SmtpSink, ids: list[str]
) -> list[dict[str, Any]]:
    """The GROUPED emails once due under `group_by_mx`, checked to have been counted
    together: three delivered, one waiting, never two connections open at once."""
    await smtp_sink.wait_for_messages(3)
    emails = await settled(account, ids)
    assert sorted(e["status"] for e in emails) == [
        "deferred",
        "delivered",
        "delivered",
        "delivered",
    ]
    assert smtp_sink.most_open_transactions == 1  # both domains' queues share one slot
    return emails
