"""Bulk replay of a webhook's deliveries (`POST /v1/webhooks/{id}/replay`): filters, dry
run, the activity log, workspace scope; against a real HTTPS receiver."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import MockClock

from tests.harness.https_receiver import HttpsReceiver
from tests.harness.service import Account, Service
from tests.harness.webhooks import create_webhook


async def _deliveries(account: Account, webhook_id: str) -> list[dict[str, Any]]:
    page = (await account.client.get(f"/v1/webhooks/{webhook_id}/deliveries")).json()
    items: list[dict[str, Any]] = page["items"]
    return sorted(items, key=lambda item: item["created_at"])


async def _until(account: Account, webhook_id: str, done: Any) -> None:
    """Poll the webhook's deliveries until `done(deliveries)` holds."""
    with trio.fail_after(10):
        while True:
            if done(await _deliveries(account, webhook_id)):
                return
            await trio.sleep(0.05)


async def _until_attempts(account: Account, webhook_id: str, attempts: int) -> None:
    await _until(account, webhook_id, lambda found: all(d["attempt"] >= attempts for d in found))


async def test_bulk_replay_requeues_the_dead_deliveries_in_the_window(
    service: Service, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    replay_url = f"/v1/webhooks/{hook['id']}/replay"
    https_receiver.respond(500)
    for _ in range(2):
        await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    # Both first attempts are answered before time moves: a jump while a POST is on the
    # wire would time it out in virtual time instead of letting the receiver answer.
    await https_receiver.wait_for_requests(2)
    await _until_attempts(account, hook["id"], 1)
    clock.jump(3600)
    await account.client.post(f"/v1/webhooks/{hook['id']}/test")
    await https_receiver.wait_for_requests(3)
    for attempt in range(2, 9):  # each jump passes one step of the retry schedule
        await _until_attempts(account, hook["id"], attempt - 1)
        clock.jump(2 * 86400)
    await _until_attempts(account, hook["id"], 8)
    early, _, late = await _deliveries(account, hook["id"])
    assert {d["status"] for d in await _deliveries(account, hook["id"])} == {"dead"}
    assert len(https_receiver.requests) == 24
    https_receiver.respond(200)

    window = {"since": early["created_at"], "until": late["created_at"]}
    dry = await account.client.post(replay_url, json={**window, "dry_run": True})
    assert dry.status_code == 200, dry.text
    assert dry.json() == {"matched": 2, "replayed": 0, "dry_run": True}
    other_type = await account.client.post(
        replay_url, json={"event_types": ["email.bounced"], "dry_run": True}
    )
    assert other_type.json()["matched"] == 0
    await service.settled()
    assert len(https_receiver.requests) == 24  # a dry run sends nothing

    done = await account.client.post(replay_url, json=window)
    assert done.json() == {"matched": 2, "replayed": 2, "dry_run": False}
    await https_receiver.wait_for_requests(26)
    wanted = ["delivered", "delivered", "dead"]
    await _until(account, hook["id"], lambda found: [d["status"] for d in found] == wanted)
    # The default takes every dead delivery: only the late one is left.
    rest = await account.client.post(replay_url, json={"dry_run": True})
    assert rest.json()["matched"] == 1
    log = (await account.client.get("/v1/audit-log")).json()["items"]
    replayed = [entry for entry in log if entry["action"] == "webhook.replayed"]
    assert [(e["target_id"], e["category"]) for e in replayed] == [(hook["id"], "Security")]


async def test_bulk_replay_refuses_bad_filters_and_other_workspaces(
    service: Service, https_receiver: HttpsReceiver
) -> None:
    account = await service.account()
    hook = await create_webhook(account, https_receiver)
    replay_url = f"/v1/webhooks/{hook['id']}/replay"
    for body in (
        {"status": "pending"},
        {"since": "2026-01-02T00:00:00Z", "until": "2026-01-01T00:00:00Z"},
        {"since": "2026-01-02T00:00:00"},  # no zone: which day it is would be a guess
        {"event_types": ["email.queued"]},
    ):
        refused = await account.client.post(replay_url, json=body)
        assert refused.status_code == 422, body
        assert refused.json()["code"] == "validation_error"
    stranger = await service.account()
    missing = await stranger.client.post(replay_url, json={"dry_run": True})
    assert missing.status_code == 404 and missing.json()["code"] == "not_found"
