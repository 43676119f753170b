"""`POST /v1/privacy/erase`: one address leaves a workspace's contacts, emails (attachments
too), events, webhook deliveries, activity log, forward logs and inbound copies, in bounded
batches, and stays suppressed by its hash; on both engines."""

from __future__ import annotations

import base64
import json
from datetime import timedelta
from typing import Any

import httpx
import psycopg
import pytest
import trio

from engine import privacy
from engine.sending import statuses
from storage.tx import Tx
from tests.harness.cluster import database_rows
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import SOURCE, letter, poll, send_inbound, verified_domain
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.webhooks import create_webhook

ANN = "ann@erase.example"


async def test_erasure_rewrites_the_address_out_and_keeps_it_suppressed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    client = account.client
    route_mail(dns_server, "erase.example")
    hook = await create_webhook(account, https_receiver, ["email.delivered"])
    people = (await client.post("/v1/contacts/", json={"name": "People"})).json()
    for address in (ANN, "bob@erase.example"):
        added = await client.post(f"/v1/contacts/{people['id']}/contacts", json={"email": address})
        assert added.status_code == 201, added.text
    body = message([ANN, "bob@erase.example"], text=f"Hello {ANN}, your order is ready.")
    sent = (await client.post("/v1/emails/", json=body)).json()
    await wait_for_status(account, sent["id"])
    await https_receiver.wait_for_requests(2)
    await service.settled()  # the deliveries' outcomes are recorded
    await client.post("/v1/suppressions/", json={"email": ANN})

    erased = await client.post("/v1/privacy/erase", json={"email": ANN.upper()})
    assert erased.status_code == 200, erased.text
    touched = erased.json()
    assert touched["contacts"] == 1 and touched["emails"] == 1
    assert touched["events"] >= 2 and touched["webhook_deliveries"] == 1
    assert touched["activity_entries"] >= 1  # suppression.created named the address
    assert touched["suppression_hash"].startswith("hmac-sha256:")

    email = await client.get(f"/v1/emails/{sent['id']}")
    assert ANN not in email.text and "bob@erase.example" in email.text
    assert "erased.invalid" in email.text  # the row keeps its shape, with a placeholder
    contacts = await client.get(f"/v1/contacts/{people['id']}")
    assert ANN not in contacts.text and "bob@erase.example" in contacts.text
    assert contacts.json()["contact_count"] == 1
    deliveries = (await client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["items"]
    for item in deliveries:
        detail = await client.get(f"/v1/webhook-deliveries/{item['id']}")
        assert ANN not in detail.text
    log = await client.get("/v1/audit-log")
    assert ANN not in log.text and "privacy.erased" in log.text
    suppressions = await client.get("/v1/suppressions/")
    assert ANN not in suppressions.text and touched["suppression_hash"] in suppressions.text

    again = await client.post("/v1/emails/", json=message(ANN))
    assert again.json()["status"] == "rejected"  # still suppressed, known by its hash only
    assert "suppressed" in again.json()["rejection_reason"]


async def test_erasure_is_scoped_to_the_workspace(service: Service, dns_server: DnsServer) -> None:
    mine = await service.account()
    theirs = await service.account()
    for account in (mine, theirs):
        listed = (await account.client.post("/v1/contacts/", json={"name": "L"})).json()
        await account.client.post(f"/v1/contacts/{listed['id']}/contacts", json={"email": ANN})
    touched = (await mine.client.post("/v1/privacy/erase", json={"email": ANN})).json()
    assert touched["contacts"] == 1
    [their_list] = (await theirs.client.get("/v1/contacts/")).json()
    assert (await theirs.client.get(f"/v1/contacts/{their_list['id']}")).json()[
        "contact_count"
    ] == 1
    assert ANN not in (await theirs.client.get("/v1/suppressions/")).text
    refused = await mine.client.post("/v1/privacy/erase", json={"email": "not an address"})
    assert refused.status_code == 422 and refused.json()["code"] == "validation_error"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_an_email_accepted_while_its_address_is_erased_is_erased_too(
    service: Service, dns_server: DnsServer, database_url: str
) -> None:
    """A send that read the suppression list before the erasure put the hash on it stores and
    commits its email after (held here by a lock at its monthly count, which it takes after
    reading the list): the erasure waits for it, then rewrites the address out of it and
    cancels it. PostgreSQL only: SQLite's writers take turns, so there a send cannot straddle
    the erasure's first write."""
    account = await ready_account(service, dns_server)
    client = account.client
    later = (service.running.runtime.clock.now() + timedelta(hours=1)).isoformat()
    first = await client.post("/v1/emails/", json=message("bob@erase.example", send_at=later))
    assert first.status_code == 202, first.text  # the workspace's monthly count has its row
    lock = await trio.to_thread.run_sync(_connect, database_url)
    try:
        lock.execute(
            "SELECT * FROM usage_shards WHERE workspace_id = %s FOR UPDATE",
            (account.workspace_id,),
        )
        results: dict[str, httpx.Response] = {}

        async def call(name: str, path: str, body: dict[str, Any]) -> None:
            results[name] = await client.post(path, json=body)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call, "sent", "/v1/emails/", message(ANN, send_at=later))
            with trio.fail_after(10):  # the send has read the list and waits to count
                while not await trio.to_thread.run_sync(_counting_held, database_url):  # noqa: ASYNC110
                    await trio.sleep(0.05)
            nursery.start_soon(call, "erased", "/v1/privacy/erase", {"email": ANN})
            await trio.sleep(1)
            assert "erased" not in results  # it waits for the send begun before it
            await trio.to_thread.run_sync(lock.commit)
    finally:
        await trio.to_thread.run_sync(lock.close)
    sent, erased = results["sent"], results["erased"]
    assert sent.status_code == 202 and erased.status_code == 200, (sent.text, erased.text)
    assert erased.json()["emails"] == 1
    email = (await client.get(f"/v1/emails/{sent.json()['id']}")).json()
    assert ANN not in json.dumps(email) and email["status"] == statuses.CANCELLED, email


def _connect(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url)


def _counting_held(url: str) -> bool:
    """Whether a send waits on the locked monthly count."""
    [(count,)] = database_rows(
        url,
        "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
        " AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO usage_shards %'",
    )
    return bool(count)


def _inbound(tx: Tx) -> list[tuple[str, bytes]]:
    return [
        (str(r["envelope_from"]), base64.b64decode(r["data"]))
        for r in tx.all("SELECT envelope_from, data FROM inbound_messages")
    ]


def _raw(tx: Tx, email_id: str) -> bytes:
    return bytes(tx.value("SELECT data FROM raw_messages WHERE email_id = :id", {"id": email_id}))


def _attachments(tx: Tx, email_id: str) -> list[dict[str, str]]:
    stored = tx.value(
        "SELECT attachments FROM email_attachments WHERE email_id = :id", {"id": email_id}
    )
    found: list[dict[str, str]] = json.loads(stored)
    return found


async def test_erasure_in_batches_reaches_attachments_forward_logs_and_inbound_copies(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(privacy, "BATCH", 2)  # three emails and more events: several batches
    db = service.running.runtime.db
    account = await ready_account(service, dns_server)
    client = account.client
    route_mail(dns_server, "erase.example")
    note = base64.b64encode(f"Invoice for {ANN}".encode()).decode()
    attachment = {"filename": f"{ANN}.txt", "content_base64": note, "content_type": "text/plain"}
    sent = []
    for _ in range(3):
        body = message(ANN, attachments=[attachment])
        sent.append((await client.post("/v1/emails/", json=body)).json()["id"])
    for email_id in sent:
        await wait_for_status(account, email_id)

    domain = await verified_domain(account, dns_server)
    urls = [https_receiver.url + "/ok", https_receiver.url + "/down"]
    route_mail(dns_server, "elsewhere.example")
    forward = {
        "source_email": SOURCE,
        "domain_id": domain["id"],
        "destination_urls": urls,
        "destination_emails": ["me@elsewhere.example"],  # a copy whose author is Ann
    }
    assert (await client.post("/v1/forwards/", json=forward)).status_code == 201
    https_receiver.respond(500)  # one URL keeps failing, so the message is kept for it
    https_receiver.respond_sequence([200])
    from_ann = letter().replace(b"alice@sender.example", ANN.encode())
    assert await send_inbound(service, [SOURCE], from_ann, sender=ANN) == set()
    await https_receiver.wait_for_requests(2)
    arrived = await smtp_sink.wait_for_messages(4)  # three sent to Ann, and her forwarded mail
    [copy] = [m for m in arrived if m.rcpt_to == ("me@elsewhere.example",)]
    assert ANN.encode() in copy.data
    await poll(account, "/v1/forwards/logs/count", lambda b: b["count"] == 2)
    [copy_id] = [e["id"] for e in (await client.get("/v1/emails/")).json() if e["id"] not in sent]
    [(sender, data)] = await db.read(_inbound)
    assert sender == ANN

    erased = await client.post("/v1/privacy/erase", json={"email": ANN})
    assert erased.status_code == 200, erased.text
    touched = erased.json()
    assert touched["emails"] == 4 and touched["events"] >= 6
    assert touched["forward_logs"] == 2 and touched["inbound_messages"] == 1

    for email_id in sent:
        detail = (await client.get(f"/v1/emails/{email_id}")).json()
        assert ANN not in str(detail) and "erased.invalid" in str(detail)
        [shown] = detail["attachments"]
        assert shown["filename"].endswith("@erased.invalid.txt")
        [kept] = await db.read(_attachments, email_id)  # the detail shows no content
        content = base64.b64decode(kept["content_base64"]).decode()
        assert content.startswith("Invoice for erased-") and ANN not in content
    forwarded = (await client.get(f"/v1/emails/{copy_id}")).json()
    assert forwarded["from_address"].endswith("@erased.invalid")
    assert ANN.encode() not in (await db.read(_raw, copy_id)).lower()
    logs = await client.get("/v1/forwards/logs")
    assert ANN not in logs.text and "erased.invalid" in logs.text
    [(sender, data)] = await db.read(_inbound)
    assert sender.endswith("@erased.invalid") and ANN.encode() not in data.lower()
    log = (await client.get("/v1/audit-log")).json()["items"]
    [entry] = [e for e in log if e["action"] == "privacy.erased"]
    assert entry["meta"]["emails"] == 4 and entry["meta"]["inbound_messages"] == 1
    assert ANN not in str(log)

    again = (await client.post("/v1/privacy/erase", json={"email": ANN})).json()
    assert again["emails"] == 0 and again["inbound_messages"] == 0  # nothing left to touch
