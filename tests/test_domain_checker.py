"""The background domain checker verifies a pending domain once its DKIM record appears."""

from __future__ import annotations

from trio.testing import MockClock

from engine.domains.checker import GIVE_UP_AFTER, INTERVAL
from tests.harness.dns_server import DnsServer
from tests.harness.service import Service


def _dkim(domain: dict[str, object]) -> dict[str, str]:
    records = domain["dns_records"]
    assert isinstance(records, list)
    record: dict[str, str] = next(r for r in records if r["purpose"] == "dkim")
    return record


async def _advance(service: Service, seconds: float) -> None:
    service.clock.jump(seconds)
    # The round the jump woke (DNS lookups and one write) runs to its end.
    await service.settled()


async def test_published_record_verifies_the_domain_without_a_verify_call(
    service: Service, clock: MockClock, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = (await account.client.post("/v1/domains/", json={"name": "auto.example"})).json()
    await _advance(service, INTERVAL.total_seconds() + 1)
    still = (await account.client.get(f"/v1/domains/{domain['id']}")).json()
    assert still["status"] == "pending"

    dkim = _dkim(domain)
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    await _advance(service, INTERVAL.total_seconds() + 1)
    verified = (await account.client.get(f"/v1/domains/{domain['id']}")).json()
    assert verified["status"] == "verified"

    log = (await account.client.get("/v1/audit-log", params={"category": "domain"})).json()
    automatic = [i for i in log["items"] if i["action"] == "domain.verified"]
    assert [entry["actor"] for entry in automatic] == ["postroom"]
    # Unchanged rounds wrote nothing: only created + verified.
    assert log["total"] == 2


async def test_checker_gives_up_on_domains_older_than_three_days(
    service: Service, clock: MockClock, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = (await account.client.post("/v1/domains/", json={"name": "late.example"})).json()
    service.clock.jump(GIVE_UP_AFTER.total_seconds() + 60)
    dkim = _dkim(domain)
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    await _advance(service, INTERVAL.total_seconds() + 1)
    assert (await account.client.get(f"/v1/domains/{domain['id']}")).json()["status"] == "pending"
    # A person can still verify it.
    checked = await account.client.post(f"/v1/domains/{domain['id']}/verify")
    assert checked.json()["status"] == "verified"
