"""Bulk send: personalised mail per contact to the sink, skips, refusals, broadcasts."""

from __future__ import annotations

from typing import Any

import trio
from trio.testing import MockClock

from engine.contacts.bulk_send import fail_interrupted
from engine.platform.wakeups import RESCAN
from storage import broadcasts as broadcasts_storage
from tests.harness.broadcasts import body, left_sending, parsed, part, sender_id
from tests.harness.contacts import MISSING, add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.sending import ready_account, route_mail
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

RECIPIENT_DOMAIN = "customers.example"


async def broadcasts(account: Account) -> list[dict[str, Any]]:
    response = await account.client.get("/v1/broadcasts/")
    assert response.status_code == 200
    found: list[dict[str, Any]] = response.json()
    return found


async def test_personalised_mail_reaches_each_contact_and_suppressed_ones_are_skipped(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, RECIPIENT_DOMAIN)
    contact_list = await create_list(account)
    list_id = contact_list["id"]
    await add_contact(
        account,
        list_id,
        f"ann@{RECIPIENT_DOMAIN}",
        name="Ann",
        metadata={"plan": "gold", "code": "<A&1>"},
    )
    await add_contact(
        account,
        list_id,
        f"bob@{RECIPIENT_DOMAIN}",
        metadata={"code": "B2", "plan": "silver\r\nBcc: eve@evil.example"},
    )
    await add_contact(account, list_id, f"carol@{RECIPIENT_DOMAIN}", name="Carol")
    suppressed = await account.client.post(
        "/v1/suppressions/", json={"email": f"carol@{RECIPIENT_DOMAIN}", "reason": "unsubscribe"}
    )
    assert suppressed.status_code == 201

    response = await account.client.post(
        f"/v1/contacts/{list_id}/send", json=body(list_id, await sender_id(account))
    )
    assert response.status_code == 200, response.text
    assert response.json() == {
        "queued": 2,
        "skipped": 1,
        "errors": [f"carol@{RECIPIENT_DOMAIN}: suppressed (unsubscribe)"],
    }

    received = await smtp_sink.wait_for_messages(2)
    by_rcpt = {m.rcpt_to: parsed(m.data) for m in received}
    assert set(by_rcpt) == {(f"ann@{RECIPIENT_DOMAIN}",), (f"bob@{RECIPIENT_DOMAIN}",)}
    ann = by_rcpt[(f"ann@{RECIPIENT_DOMAIN}",)]
    assert ann["Subject"] == "Hello Ann, your gold plan"
    assert ann["To"] == f"Ann <ann@{RECIPIENT_DOMAIN}>"
    # Then the footer with the contact's own unsubscribe link (tests/test_unsubscribe.py).
    assert part(ann, "plain").startswith(f"Dear Ann, code <A&1> for ann@{RECIPIENT_DOMAIN}.\r\n")
    assert f"<p>Dear Ann, code &lt;A&amp;1&gt; for ann@{RECIPIENT_DOMAIN}.</p>" in part(ann, "html")
    bob = by_rcpt[(f"bob@{RECIPIENT_DOMAIN}",)]
    # No name renders empty; a line break in a value cannot start a header of its own.
    assert bob["Subject"] == "Hello , your silver Bcc: eve@evil.example plan"
    assert bob["Bcc"] is None
    assert part(bob, "plain").startswith(f"Dear , code B2 for bob@{RECIPIENT_DOMAIN}.\r\n")
    for message in (ann, bob):
        assert message["List-Unsubscribe"].startswith("<http://postroom.test/")
        assert message["List-Unsubscribe-Post"] == "List-Unsubscribe=One-Click"
    assert ann["List-Unsubscribe"] != bob["List-Unsubscribe"]

    [broadcast] = await broadcasts(account)
    assert broadcast["status"] == "sent"
    assert broadcast["queued"] == 2 and broadcast["skipped"] == 1
    assert broadcast["contact_list_id"] == list_id
    assert broadcast["name"] == "Hello {{name}}, your {{plan}} plan"
    assert broadcast["tags"] == ["news"]
    log = (await account.client.get("/v1/emails/", params={"limit": 10})).json()
    assert sorted(e["to_addresses"][0] for e in log) == [
        f"ann@{RECIPIENT_DOMAIN}",
        f"bob@{RECIPIENT_DOMAIN}",
    ]
    assert {e["source"] for e in log} == {"broadcast"}
    assert all(e["tags"] == ["news"] for e in log)
    activity = (await account.client.get("/v1/audit-log", params={"category": "Send"})).json()
    actions = [i["action"] for i in activity["items"]]
    assert actions[:2] == ["broadcast.sent", "broadcast.created"]


async def test_refusals_have_the_spec_status_codes(service: Service, dns_server: DnsServer) -> None:
    account = await ready_account(service, dns_server)
    sender = await sender_id(account)
    contact_list = await create_list(account)
    list_id = contact_list["id"]
    other_list = await create_list(account, "Other")
    path = f"/v1/contacts/{list_id}/send"

    empty = await account.client.post(path, json=body(list_id, sender))
    assert empty.status_code == 400
    assert empty.json()["code"] == "empty_list"
    await add_contact(account, list_id, "ann@example.com")

    mismatch = await account.client.post(path, json=body(other_list["id"], sender))
    assert mismatch.status_code == 400
    assert mismatch.json()["code"] == "list_mismatch"

    unknown_sender = await account.client.post(path, json=body(list_id, MISSING))
    assert unknown_sender.status_code == 404
    unknown_list = await account.client.post(
        f"/v1/contacts/{MISSING}/send", json=body(MISSING, sender)
    )
    assert unknown_list.status_code == 404

    for invalid in (
        body(list_id, sender, html=None, text=None),
        body(list_id, sender, subject=""),
        body("not-a-uuid", sender),
        {k: v for k, v in body(list_id, sender).items() if k != "sender_address_id"},
        body(list_id, sender, tags="news"),
        body(list_id, sender, tags=["news\r\nBcc: all@example.com"]),
    ):
        response = await account.client.post(path, json=invalid)
        assert response.status_code == 422, invalid
        assert response.json()["code"] == "validation_error"

    # Another workspace sees neither the list nor the sender.
    stranger = await service.account("starter")
    assert (await stranger.client.post(path, json=body(list_id, sender))).status_code == 404
    assert await broadcasts(account) == []


async def test_sender_on_an_unverified_domain_is_404(service: Service) -> None:
    account = await service.account("starter")
    await account.client.post("/v1/domains/", json={"name": "pending.example"})
    sender = await account.client.post("/v1/senders/", json={"email": "hi@pending.example"})
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], "ann@example.com")
    response = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json=body(contact_list["id"], sender.json()["id"]),
    )
    assert response.status_code == 404
    assert response.json()["code"] == "sender_not_found"


async def test_monthly_volume_is_checked_once_for_the_whole_send(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server, plan="free")  # 3,000 a month
    route_mail(dns_server, RECIPIENT_DOMAIN)
    sender = await sender_id(account)
    contact_list = await create_list(account)
    rows = "".join(f"u{i}@{RECIPIENT_DOMAIN}\n" for i in range(1_000))
    await account.client.post(
        f"/v1/contacts/{contact_list['id']}/upload", files={"file": ("c.csv", "email\n" + rows)}
    )
    path = f"/v1/contacts/{contact_list['id']}/send"
    for _ in range(3):
        sent = await account.client.post(path, json=body(contact_list["id"], sender))
        assert sent.json()["queued"] == 1_000
    refused = await account.client.post(path, json=body(contact_list["id"], sender))
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"
    assert len(await broadcasts(account)) == 3


async def test_idempotency_key_sends_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, RECIPIENT_DOMAIN)
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], f"ann@{RECIPIENT_DOMAIN}")
    path = f"/v1/contacts/{contact_list['id']}/send"
    payload = body(contact_list["id"], await sender_id(account))
    headers = {"Idempotency-Key": "spring-newsletter"}
    first = await account.client.post(path, json=payload, headers=headers)
    second = await account.client.post(path, json=payload, headers=headers)
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() == {"queued": 1, "skipped": 0, "errors": []}
    other = await account.client.post(path, json={**payload, "subject": "Another"}, headers=headers)
    assert other.status_code == 409
    assert other.json()["code"] == "idempotency_conflict"
    await smtp_sink.wait_for_messages(1)
    await service.settled()
    assert len(smtp_sink.messages) == 1
    assert len(await broadcasts(account)) == 1


async def test_all_contacts_skipped_fails_the_broadcast(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], "gone@example.com")
    await account.client.post(
        "/v1/suppressions/", json={"email": "gone@example.com", "reason": "hard_bounce"}
    )
    response = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json=body(contact_list["id"], await sender_id(account)),
    )
    assert response.json() == {
        "queued": 0,
        "skipped": 1,
        "errors": ["gone@example.com: suppressed (hard_bounce)"],
    }
    [broadcast] = await broadcasts(account)
    assert broadcast["status"] == "failed"
    assert broadcast["failure_reason"] == "every contact was skipped"


async def test_broadcasts_cut_short_by_a_stop_are_failed_at_start(
    service: Service, clock: MockClock
) -> None:
    account = await service.account("business")
    rt = service.running.runtime
    gone = left_sending(account, "a-node-that-stopped", rt.clock.now())
    live = left_sending(account, rt.node, rt.clock.now())
    for broadcast in (gone, live):
        await rt.db.write(broadcasts_storage.insert, broadcast)

    # Its node is not alive: its queuing died with it (the recovery actor, woken by the
    # rescan every node hears as it starts listening, may have failed it first).
    assert await fail_interrupted(rt) in (0, 1)
    by_id = {b["id"]: b for b in await broadcasts(account)}
    assert by_id[gone.id]["status"] == "failed"
    assert by_id[gone.id]["failure_reason"].startswith("interrupted")
    assert by_id[gone.id]["queued"] == 40
    assert by_id[live.id]["status"] == "sending"  # a live node may still be at work

    service.clock.jump(11 * 60)
    await fail_interrupted(rt)  # no progress for 10 minutes: given up
    assert {b["status"] for b in await broadcasts(account)} == {"failed"}


async def test_the_recovery_actor_fails_what_a_reaped_node_left_sending(
    service: Service, clock: MockClock
) -> None:
    """Reaping a dead node announces a rescan; the broadcast recovery actor (one node at a
    time) hears it and fails that node's broadcast, and with no announcement at all it gives
    up on a broadcast that made no progress for 10 minutes."""
    account = await service.account("business")
    rt = service.running.runtime
    gone = left_sending(account, "a-node-that-was-reaped", rt.clock.now())
    live = left_sending(account, rt.node, rt.clock.now())
    for broadcast in (gone, live):
        await rt.db.write(broadcasts_storage.insert, broadcast)

    rt.wakeups.announce([RESCAN])  # what the reaper announces
    await until_failed(account, gone.id, within=5)
    assert {b["id"]: b["status"] for b in await broadcasts(account)}[live.id] == "sending"

    # The actor's own look, at least every 10 minutes: once it waits again (its round over,
    # its next look set), 11 minutes pass.
    await service.settled()
    service.clock.jump(11 * 60)
    await until_failed(account, live.id, within=30)


async def until_failed(account: Account, broadcast_id: str, within: float) -> None:
    with trio.fail_after(within):
        while True:
            if {b["id"]: b["status"] for b in await broadcasts(account)}[broadcast_id] == "failed":
                return
            await trio.sleep(0.05)
