"""Retention: past the plan's period an email's content is deleted by the sweeper while the
row keeps its metadata and events; newer emails keep theirs. In virtual time, both engines."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import trio
from trio.testing import MockClock

from engine import retention
from tests.harness.dns_server import DnsServer
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.test_sending import message, ready_account, route_mail, wait_for_status

DAY = 86400


async def _send(account: Account) -> str:
    sent = await account.client.post("/v1/emails/", json=message("ann@keep.example", tags=["kept"]))
    assert sent.status_code == 202, sent.text
    email_id: str = sent.json()["id"]
    assert (await wait_for_status(account, email_id))["status"] == "delivered"
    return email_id


async def _email(account: Account, email_id: str) -> dict[str, Any]:
    found: dict[str, Any] = (await account.client.get(f"/v1/emails/{email_id}")).json()
    return found


async def test_content_past_the_plans_period_is_deleted_and_metadata_kept(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="starter")
    assert retention.retention_of("starter") == timedelta(days=45)
    route_mail(dns_server, "keep.example")
    old = await _send(account)
    before = await _email(account, old)
    assert before["html"] and before["text"]
    clock.jump(40 * DAY)
    new = await _send(account)
    clock.jump(6 * DAY)  # `old` is now 46 days old, `new` 6; the sweeper's hour has passed

    with trio.fail_after(10):
        while True:
            purged = await _email(account, old)
            if purged["html"] is None:
                break
            await trio.sleep(0.05)
    assert purged["text"] is None
    for field in ("subject", "status", "from_address", "to_addresses", "tags", "created_at"):
        assert purged[field] == before[field], field
    assert purged["events"] == before["events"] and purged["events"]
    kept = await _email(account, new)
    assert kept["html"] and kept["text"]
    listed = (await account.client.get("/v1/emails/")).json()
    assert {item["id"] for item in listed} == {old, new}
