"""Domains as tests set them up through the API: created, a record of a given purpose,
published exactly as the API says, verified, or added and verified through its DKIM record."""

from __future__ import annotations

from typing import Any

from tests.harness.dns_server import DnsServer
from tests.harness.service import Account


async def create_domain(account: Account, name: str = "example.com") -> dict[str, Any]:
    response = await account.client.post("/v1/domains/", json={"name": name})
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def verify(account: Account, domain: dict[str, Any]) -> dict[str, Any]:
    response = await account.client.post(f"/v1/domains/{domain['id']}/verify")
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


def record(domain: dict[str, Any], purpose: str) -> dict[str, Any]:
    found: dict[str, Any] = next(r for r in domain["dns_records"] if r["purpose"] == purpose)
    return found


def publish(dns_server: DnsServer, *records: dict[str, Any]) -> None:
    """Publish records exactly as the API told the owner to."""
    for entry in records:
        dns_server.set(entry["host"], entry["type"], [entry["value"]])


async def add_domain(
    account: Account, dns_server: DnsServer, name: str, *, verify: bool = True
) -> dict[str, Any]:
    """A domain of the account, verified through its DKIM record unless told otherwise."""
    domain: dict[str, Any] = (await account.client.post("/v1/domains/", json={"name": name})).json()
    if verify:
        dkim_record = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
        dns_server.set(dkim_record["host"], "TXT", [dkim_record["value"]])
        verified = await account.client.post(f"/v1/domains/{domain['id']}/verify")
        assert verified.json()["status"] == "verified"
    return domain
