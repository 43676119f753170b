"""Retention: past the workspace's period (its plan's, or a shorter one it sets) an email's
content and the inbound copies kept for forwarding are deleted by the sweeper while the rows
keep their metadata, events, jobs and logs; newer ones keep theirs. In virtual time, both
engines."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import MockClock

from engine import retention
from engine.accounts import users as accounts
from storage.retention import EXPIRED_JOB_ERROR
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import (
    DESTINATION,
    SOURCE,
    forwarding_account,
    letter,
    poll,
    rule,
    send_inbound,
)
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

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
    assert retention.plan_days("starter") == 45
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


async def test_a_workspace_sets_a_shorter_period_within_its_plans(service: Service) -> None:
    account = await service.account("starter")
    client = account.client
    default = await client.get("/v1/privacy/retention")
    assert default.json() == {"days": 45, "custom_days": None, "plan_days": 45}
    for beyond in (46, 0, -1):
        refused = await client.put("/v1/privacy/retention", json={"days": beyond})
        assert refused.status_code == 422, beyond
        assert refused.json()["code"] == "validation_error"
        assert refused.json()["errors"][0]["loc"] == ["body", "days"]
    assert (await client.get("/v1/privacy/retention")).json()["days"] == 45

    shorter = await client.put("/v1/privacy/retention", json={"days": 7})
    assert shorter.status_code == 200
    assert shorter.json() == {"days": 7, "custom_days": 7, "plan_days": 45}
    assert (await client.get("/v1/privacy/retention")).json()["days"] == 7
    log = (await client.get("/v1/audit-log", params={"category": "Send"})).json()
    [entry] = [e for e in log["items"] if e["action"] == "privacy.retention_changed"]
    assert entry["meta"] == {"days": 7, "previous_days": None}

    rt = service.running.runtime
    assert (await client.put("/v1/privacy/retention", json={"days": 40})).json()["days"] == 40
    await accounts.set_plan(rt, account.email, "free")  # a downgrade caps it at once
    capped = (await client.get("/v1/privacy/retention")).json()
    assert capped == {"days": 30, "custom_days": 40, "plan_days": 30}
    assert (await client.put("/v1/privacy/retention", json={"days": 40})).status_code == 422
    await accounts.set_plan(rt, account.email, "starter")
    assert (await client.get("/v1/privacy/retention")).json()["days"] == 40
    other = await service.account("starter")  # another workspace keeps its plan's period
    assert (await other.client.get("/v1/privacy/retention")).json()["days"] == 45
    back = await client.put("/v1/privacy/retention", json={"days": None})
    assert back.json() == {"days": 45, "custom_days": None, "plan_days": 45}


def _inbound_state(tx: Tx) -> tuple[int, list[tuple[str, str | None]]]:
    messages = int(tx.value("SELECT COUNT(*) FROM inbound_messages"))
    jobs = [
        (str(r["status"]), r["last_error"])
        for r in tx.all("SELECT status, last_error FROM forward_jobs WHERE kind = 'url'")
    ]
    return messages, jobs


def _copy_state(tx: Tx, workspace_id: str) -> list[tuple[bool, int]]:
    """Per forwarded copy of the workspace: purged, and how many raw messages it keeps."""
    return [
        (
            r["content_purged_at"] is not None,
            int(
                tx.value("SELECT COUNT(*) FROM raw_messages WHERE email_id = :id", {"id": r["id"]})
            ),
        )
        for r in tx.all(
            "SELECT id, content_purged_at FROM emails WHERE workspace_id = :ws"
            " AND source = 'forward' ORDER BY created_at",
            {"ws": workspace_id},
        )
    ]


async def _sweep_until(service: Service, done: Any) -> bool:
    """Move time an hour at a time (a sweep each) until the inbound state is `done`."""
    for _ in range(10):
        await service.settled()  # what the last jump woke runs
        if done(await service.running.runtime.db.read(_inbound_state)):
            return True
        service.clock.jump(3600)
    return False


async def test_inbound_copies_past_the_workspaces_own_period_are_deleted(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
    clock: MockClock,
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    db = service.running.runtime.db
    set_to = await account.client.put("/v1/privacy/retention", json={"days": 1})
    assert set_to.json()["days"] == 1
    url = https_receiver.url + "/down"
    https_receiver.respond(500)  # the URL keeps failing: the message is kept for its retries
    forward = rule(domain, destination_emails=[DESTINATION], destination_urls=[url])
    assert (await account.client.post("/v1/forwards/", json=forward)).status_code == 201
    assert await send_inbound(service, [SOURCE], letter(subject="old")) == set()
    await smtp_sink.wait_for_messages(1)
    await https_receiver.wait_for_requests(1)
    await poll(account, "/v1/forwards/logs/count", lambda b: b["count"] == 1)
    assert (await db.read(_inbound_state))[0] == 1
    assert await db.read(_copy_state, account.workspace_id) == [(False, 1)]

    clock.jump(2 * DAY)
    assert await _sweep_until(service, lambda state: state[0] == 0)
    _, [(status, error)] = await db.read(_inbound_state)
    assert (status, error) == ("failed", EXPIRED_JOB_ERROR)
    assert await db.read(_copy_state, account.workspace_id) == [(True, 0)]
    logs = (await account.client.get("/v1/forwards/logs")).json()
    assert [entry["subject"] for entry in logs] == ["old"]  # the record stays

    assert await send_inbound(service, [SOURCE], letter(subject="new")) == set()
    await smtp_sink.wait_for_messages(2)
    await https_receiver.wait_for_requests(2)
    for _ in range(3):  # three sweeps: the new message is within its day
        clock.jump(3600)
        await service.settled()
    messages, jobs = await db.read(_inbound_state)
    assert messages == 1 and sorted(status for status, _ in jobs) == ["failed", "retrying"]
    assert await db.read(_copy_state, account.workspace_id) == [(True, 0), (False, 1)]
    clock.jump(DAY)  # and past it, it goes too
    assert await _sweep_until(service, lambda state: state[0] == 0)
