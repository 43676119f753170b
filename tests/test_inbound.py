"""Inbound mail end to end: a message for a forwarded address reaches the destination
mailbox (through delivery, at the SMTP sink) and the destination URL (JSON, at the HTTPS
receiver); unknown and paused addresses are refused; logs, count and stats follow."""

from __future__ import annotations

from datetime import timedelta

import trio
from trio.testing import MockClock

from engine.forwarding import forwarder
from engine.platform import faults
from storage import inbound as storage_inbound
from storage.leases import Fault
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import (
    DESTINATION,
    DOMAIN,
    SOURCE,
    forwarding_account,
    letter,
    poll,
    rule,
    send_inbound,
)
from tests.harness.sending import dkim_verifies, route_mail
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink


async def test_forwarded_mail_reaches_the_mailbox_and_the_url(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    forward = (
        await account.client.post(
            "/v1/forwards/",
            json=rule(
                domain,
                destination_emails=[DESTINATION],
                destination_urls=[https_receiver.url + "/inbound"],
            ),
        )
    ).json()
    original = letter(attachment=True)
    assert await send_inbound(service, [SOURCE], original) == set()

    [copy] = await smtp_sink.wait_for_messages(1)
    assert copy.rcpt_to == (DESTINATION,)
    assert copy.mail_from.startswith("bounces+") and copy.mail_from.endswith(f"@{DOMAIN}")
    assert b"From: Alice Example <alice@sender.example>" in copy.data
    assert b"Subject: Hello there" in copy.data
    assert f"X-Original-To: {SOURCE}".encode() in copy.data
    assert await trio.to_thread.run_sync(dkim_verifies, copy.data, dns_server)

    [request] = await https_receiver.wait_for_requests(1)
    assert request.method == "POST" and request.path == "/inbound"
    document = request.json()
    assert document["forward_id"] == forward["id"]
    assert document["recipient"] == SOURCE
    assert document["from"] == "Alice Example <alice@sender.example>"
    assert document["to"] == SOURCE
    assert document["subject"] == "Hello there"
    assert document["text"] == "Plain words.\n"
    assert "<b>words</b>" in document["html"]
    assert {"name": "Message-ID", "value": "<first-letter@sender.example>"} in document["headers"]
    [attached] = document["attachments"]
    assert attached["filename"] == "a.pdf"
    assert attached["content_type"] == "application/pdf"
    assert attached["size"] == len(b"%PDF-1.4 not really")

    logs = await poll(account, "/v1/forwards/logs", lambda body: len(body) == 2)
    assert {e["forwarded_to"] for e in logs} == {DESTINATION, https_receiver.url + "/inbound"}
    for entry in logs:
        assert entry["from_address"] == "alice@sender.example"
        assert entry["original_to"] == SOURCE
        assert entry["subject"] == "Hello there"
        assert entry["message_id"] == "<first-letter@sender.example>"
        # As kept: under our MX's Received and Authentication-Results fields.
        assert len(original) < entry["size_bytes"] < len(original) + 1000
        assert entry["created_at"].endswith("Z")
    count = await account.client.get(
        "/v1/forwards/logs/count", params={"forward_id": forward["id"]}
    )
    assert count.json() == {"count": 2}
    stats = (await account.client.get("/v1/forwards/stats")).json()
    assert stats == {"total_this_month": 2, "per_rule": {forward["id"]: 2}}
    [listed] = (await account.client.get("/v1/forwards/")).json()
    assert listed["delivery_count"] == 2
    assert listed["last_delivered_at"] is not None


async def test_unknown_addresses_are_refused(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    await account.client.post("/v1/forwards/", json=rule(domain))
    unknown = [
        f"nobody@{DOMAIN}",
        "someone@not-ours.example",
        f"bounces+2b0f2a44-8f4b-4a5e-9a0c-7d1c7a1e0c11@{DOMAIN}",  # no such email
    ]
    assert await send_inbound(service, unknown, letter()) == set(unknown)
    await service.settled()
    assert smtp_sink.messages == []


async def test_paused_forward_refuses_until_resumed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    forward = (await account.client.post("/v1/forwards/", json=rule(domain))).json()
    path = f"/v1/forwards/{forward['id']}"
    await account.client.patch(path, json={"is_active": False})
    assert await send_inbound(service, [SOURCE], letter(subject="while paused")) == {SOURCE}
    await account.client.patch(path, json={"is_active": True})
    assert await send_inbound(service, [SOURCE], letter(subject="resumed")) == set()
    [copy] = await smtp_sink.wait_for_messages(1)
    assert b"Subject: resumed" in copy.data
    await account.client.delete(path)
    assert await send_inbound(service, [SOURCE], letter(subject="deleted")) == {SOURCE}


async def test_failing_url_is_retried_on_the_schedule(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    url = https_receiver.url + "/flaky"
    await account.client.post(
        "/v1/forwards/", json=rule(domain, destination_emails=[], destination_urls=[url])
    )
    https_receiver.respond_sequence([500, 503])
    assert await send_inbound(service, [SOURCE], letter()) == set()
    await https_receiver.wait_for_requests(1)
    await service.settled()
    assert len(https_receiver.requests) == 1
    assert await poll(account, "/v1/forwards/logs/count", lambda b: True) == {"count": 0}
    clock.jump(60)  # first retry after 1 minute
    await https_receiver.wait_for_requests(2)
    await service.settled()  # the failure is recorded, and the next retry timed from it
    clock.jump(300)  # second after 5 more
    await https_receiver.wait_for_requests(3)
    assert await poll(account, "/v1/forwards/logs/count", lambda b: b["count"] == 1)
    assert [r.json()["subject"] for r in https_receiver.requests] == ["Hello there"] * 3


async def test_one_message_to_two_rules_is_forwarded_once_per_rule(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    url = https_receiver.url + "/two"
    for source in (SOURCE, f"sales@{DOMAIN}"):
        body = rule(domain, source_email=source, destination_emails=[], destination_urls=[url])
        assert (await account.client.post("/v1/forwards/", json=body)).status_code == 201
    assert await send_inbound(service, [SOURCE, f"sales@{DOMAIN}"], letter()) == set()
    requests = await https_receiver.wait_for_requests(2)
    assert {r.json()["recipient"] for r in requests} == {SOURCE, f"sales@{DOMAIN}"}
    await service.settled()
    assert len(https_receiver.requests) == 2


async def test_a_message_this_rule_already_forwarded_is_not_sent_round_again(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    await account.client.post("/v1/forwards/", json=rule(domain))
    looped = f"X-Original-To: {SOURCE}\r\n".encode() + letter(subject="round and round")
    assert await send_inbound(service, [SOURCE], looped) == set()
    assert await send_inbound(service, [SOURCE], letter(subject="fresh")) == set()
    [copy] = await smtp_sink.wait_for_messages(1)
    assert b"Subject: fresh" in copy.data
    await service.settled()
    assert len(smtp_sink.messages) == 1


async def test_a_deleted_domain_stops_its_forwards(service: Service, dns_server: DnsServer) -> None:
    account, domain = await forwarding_account(service, dns_server)
    await account.client.post("/v1/forwards/", json=rule(domain))
    assert (await account.client.delete(f"/v1/domains/{domain['id']}")).status_code == 204
    assert await send_inbound(service, [SOURCE], letter()) == {SOURCE}


async def test_work_leased_by_a_node_that_died_is_taken_over(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    url = https_receiver.url + "/after-crash"
    body = rule(domain, destination_emails=[], destination_urls=[url])
    forward = (await account.client.post("/v1/forwards/", json=body)).json()
    rt = service.running.runtime
    now = rt.clock.now()

    def stored_then_claimed_by_a_dead_node(tx: Tx) -> None:
        job = storage_inbound.NewJob(forward["id"], account.workspace_id, SOURCE, "url", url)
        storage_inbound.insert_message(tx, "alice@sender.example", [SOURCE], letter(), [job], now)
        storage_inbound.claim_due(
            tx, now, now + timedelta(minutes=5), "dead-node", 10, faults.policy(now)
        )

    await rt.db.write(stored_then_claimed_by_a_dead_node)
    await service.settled()
    assert https_receiver.requests == []  # the lease still holds
    clock.jump(5 * 60)
    [request] = await https_receiver.wait_for_requests(1)
    assert request.json()["forward_id"] == forward["id"]
    assert await poll(account, "/v1/forwards/logs/count", lambda b: b["count"] == 1)


async def _job_taken_over(
    service: Service, dns_server: DnsServer
) -> tuple[Account, storage_inbound.Job, storage_inbound.InboundMessage]:
    """A forward job this node claimed, then taken over by `another-node` (as when this node
    stalled and was declared dead); the account, the job and its message."""
    account, domain = await forwarding_account(service, dns_server)
    forward = (
        await account.client.post(
            "/v1/forwards/", json=rule(domain, destination_emails=[DESTINATION])
        )
    ).json()
    rt = service.running.runtime
    now = rt.clock.now()

    def taken_over(tx: Tx) -> tuple[storage_inbound.Job, storage_inbound.InboundMessage]:
        job = storage_inbound.NewJob(
            forward["id"], account.workspace_id, SOURCE, "email", DESTINATION
        )
        storage_inbound.insert_message(tx, "alice@sender.example", [SOURCE], letter(), [job], now)
        lease = now + timedelta(minutes=5)
        [claimed] = storage_inbound.claim_due(tx, now, lease, rt.node, 10, faults.policy(now)).items
        stored, _ = storage_inbound.messages(tx, [claimed.message_id], content=False)
        tx.execute(
            "UPDATE forward_jobs SET leased_by = 'another-node' WHERE id = :id", {"id": claimed.id}
        )
        return claimed, stored[claimed.message_id]

    job, message = await rt.db.write(taken_over)
    return account, job, message


async def test_a_node_declared_dead_while_it_worked_a_job_queues_no_second_copy(
    service: Service, dns_server: DnsServer
) -> None:
    """A node that stalled while forwarding (its leases freed, the job claimed by another
    node) must not store its copy when it wakes: the other node forwards it."""
    account, job, message = await _job_taken_over(service, dns_server)
    rt = service.running.runtime
    now = rt.clock.now()
    stale = await rt.db.write(forwarder._emailed, job, message, now, rt.usage_shard, rt.node)
    assert stale is None
    assert (await account.client.get("/v1/emails")).json() == []
    assert (await account.client.get("/v1/forwards/logs/count")).json()["count"] == 0
    # The node that holds it now forwards it, once.
    mine = await rt.db.write(forwarder._emailed, job, message, now, rt.usage_shard, "another-node")
    assert mine is True
    assert len((await account.client.get("/v1/emails")).json()) == 1


async def test_a_node_declared_dead_while_a_job_raised_counts_no_fault_on_it(
    service: Service, dns_server: DnsServer
) -> None:
    """A stale node whose work on a job raised must not count a fault on it (nor release or
    quarantine it) once another node holds it: only the holder's faults count."""
    _, job, _ = await _job_taken_over(service, dns_server)
    rt = service.running.runtime
    now = rt.clock.now()

    def fault(tx: Tx, holder: str) -> tuple[int, str | None]:
        storage_inbound.JOBS.record_faults(
            tx, [Fault(job.id, "boom")], now, faults.policy(now), holder
        )
        row = tx.one("SELECT faults, leased_by FROM forward_jobs WHERE id = :id", {"id": job.id})
        assert row is not None
        return row["faults"], row["leased_by"]

    assert await rt.db.write(fault, rt.node) == (0, "another-node")
    assert await rt.db.write(fault, "another-node") == (1, None)
