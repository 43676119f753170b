"""Erasure leaves nothing and is final (issue 28, item 4), on both engines.

The address is planted through every door a tenant has (sends with it as to, cc, bcc and
reply-to, in subjects, bodies, headers and attachments; tracking links followed; a
suppression and its override window; an idempotent answer; contacts; a saved search; a
template; an agent's unconfirmed preview; webhook deliveries; sandbox captures and
outcomes still pending), erased, then looked for in every column of every table and, on
SQLite, in the raw bytes of the database, its write-ahead log and shared-memory files.
"""

from __future__ import annotations

import base64
import hashlib
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from trio.testing import MockClock

from engine.sending import tracking
from storage.codec import timestamp
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.mcp import call, mcp_client, set_policy
from tests.harness.sandbox import sandbox_account
from tests.harness.sandbox import send as sandbox_send
from tests.harness.sending import SENDER, message, ready_account, route_mail, wait_for_status
from tests.harness.service import PUBLIC_URL, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.webhooks import create_webhook

ANN = "ann.lee@erase.example"
SCRIPTED = "complain-after-1h@customer.example"  # the sandbox complains for it an hour later
BOB = "bob@erase.example"


def _tables(tx: Tx) -> list[str]:
    if tx.dialect == "sqlite":
        rows = tx.all("SELECT name FROM sqlite_master WHERE type = 'table'")
    else:
        rows = tx.all(
            "SELECT table_name AS name FROM information_schema.tables"
            " WHERE table_schema = current_schema() AND table_type = 'BASE TABLE'"
        )
    return sorted(str(row["name"]) for row in rows)


def _texts(value: Any) -> list[bytes]:
    """A stored value as bytes to search, with what base64 inside it encodes."""
    if value is None or isinstance(value, bool | int | float):
        return []
    raw = bytes(value) if isinstance(value, bytes | memoryview) else str(value).encode()
    found = [raw.lower()]
    for chunk in re.findall(rb"[A-Za-z0-9+/]{16,}={0,2}", raw):
        try:
            found.append(base64.b64decode(chunk + b"=" * (-len(chunk) % 4)).lower())
        except ValueError:
            continue
    return found


def holding(tx: Tx, address: str) -> list[str]:
    """Every `table.column` of the database that holds `address` (any case), plainly or in
    base64 (attachments, inbound messages)."""
    needle = address.lower().encode()
    hits = []
    for table in _tables(tx):
        for row in tx.all(f"SELECT * FROM {table}"):
            for column, value in row.items():
                if any(needle in text for text in _texts(value)):
                    hits.append(f"{table}.{column}")
    return sorted(set(hits))


def _files_holding(database_url: str, address: str) -> list[str]:
    path = Path(database_url.removeprefix("sqlite:///"))
    needle = address.lower().encode()
    return [
        file.name
        for file in (path, Path(f"{path}-wal"), Path(f"{path}-shm"))
        if file.exists() and needle in file.read_bytes().lower()
    ]


def _links(data: bytes) -> tuple[str, str, str]:
    """The open pixel, the first click link and the unsubscribe URL of a delivered message."""
    text = data.decode("ascii", "replace").replace("=\r\n", "").replace("=3D", "=")
    [pixel] = re.findall(rf'src="({PUBLIC_URL}/t/o/[^"]+)"', text)
    click = re.findall(rf'href="({PUBLIC_URL}/t/c/[^"]+)"', text)[0]
    [unsubscribe] = re.findall(rf"<({PUBLIC_URL}/t/u/[^>]+)>", text)
    return pixel, click, unsubscribe


async def test_erasure_leaves_the_address_in_no_table_and_no_file(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
    database_url: str,
    clock: MockClock,
) -> None:
    db = service.running.runtime.db
    account = await ready_account(service, dns_server)
    client = account.client
    route_mail(dns_server, "erase.example")
    domain = (await client.get("/v1/domains/")).json()[0]
    await client.patch(
        f"/v1/domains/{domain['id']}", json={"open_tracking": True, "click_tracking": True}
    )
    await create_webhook(account, https_receiver)
    note = base64.b64encode(f"Statement for {ANN}".encode()).decode()
    sends = [
        message(
            ANN,
            html=f'<p>Hi {ANN}, <a href="https://shop.example/o?id=1">order</a></p>',
            unsubscribe=True,
        ),
        message(BOB, cc=[{"email": ANN.upper(), "name": "Ann"}]),
        message(BOB, bcc=[{"email": ANN}]),
        message(
            BOB,
            reply_to={"email": ANN, "name": f"Ann <{ANN}>"},
            subject=f"About {ANN}",
            text=f"Please call {ANN} back.",
            headers={"X-Customer": ANN},
            attachments=[{"filename": f"{ANN}.txt", "content_base64": note}],
        ),
    ]
    ids = []
    for body in sends:
        sent = await client.post("/v1/emails/", json=body)
        assert sent.status_code == 202, sent.text
        ids.append(sent.json()["id"])
    for email_id in ids:
        await wait_for_status(account, email_id)
    arrived = await smtp_sink.wait_for_messages(4)
    [to_ann] = [m for m in arrived if m.rcpt_to == (ANN,)]
    pixel, click, unsubscribe = _links(to_ann.data)
    reader = service.client()
    assert (await reader.get(pixel.removeprefix(PUBLIC_URL))).status_code == 200
    assert (await reader.get(click.removeprefix(PUBLIC_URL))).status_code == 302
    await https_receiver.wait_for_requests(8)

    # A suppression, the override window its refused send opens, and that send's answer
    # kept for its idempotency key.
    assert (await client.post("/v1/suppressions/", json={"email": ANN})).status_code == 201
    refused = await client.post(
        "/v1/emails/", json=message(ANN), headers={"Idempotency-Key": "ann-1"}
    )
    assert refused.json()["status"] == "rejected" and ANN in refused.json()["rejection_reason"]
    people = (await client.post("/v1/contacts/", json={"name": f"Friends of {ANN}"})).json()
    for contact in ({"email": ANN}, {"email": BOB, "metadata": {"referred_by": ANN}}):
        added = await client.post(f"/v1/contacts/{people['id']}/contacts", json=contact)
        assert added.status_code == 201, added.text
    searches = {"searches": [{"name": "Ann", "query": f"to:{ANN}"}]}
    assert (await client.put("/v1/emails/saved-searches", json=searches)).status_code == 200
    template = {"name": "Ann's", "subject": "Hi", "text_body": f"Write to {ANN}"}
    assert (await client.post("/v1/templates/", json=template)).status_code == 201
    await set_policy(service, account, policy="send")
    async with mcp_client(service, account.api_key) as agent:
        draft = {"from_": {"email": SENDER}, "to": [{"email": ANN}], "subject": "Hi", "text": "x"}
        preview = await call(agent, "send_email", **draft)
        assert preview["confirmation_token"]  # never confirmed

    # A sandboxed workspace: the capture of a message and an outcome due in an hour.
    sandboxed = await sandbox_account(service)
    captured = await sandbox_send(sandboxed, SCRIPTED, reply_to={"email": SCRIPTED})
    await wait_for_status(sandboxed, captured)

    assert "emails.to_addresses" in await db.read(holding, ANN)
    assert "sandbox_outcomes.recipient" in await db.read(holding, SCRIPTED)

    erased = await client.post("/v1/privacy/erase", json={"email": ANN})
    assert erased.status_code == 200, erased.text
    assert erased.json()["emails"] == 5 and erased.json()["agent_previews"] == 1
    done = await sandboxed.client.post("/v1/privacy/erase", json={"email": SCRIPTED})
    assert done.status_code == 200 and done.json()["sandbox_outcomes"] == 1

    # Her old links still answer her, but write nothing; a send to her is refused, every
    # time (no override), and stores her placeholder only.
    assert (await reader.get(click.removeprefix(PUBLIC_URL))).status_code == 302
    unsubscribed = await reader.post(unsubscribe.removeprefix(PUBLIC_URL))
    assert unsubscribed.status_code == 200
    for _ in range(2):
        again = await client.post("/v1/emails/", json=sends[3] | {"to": [{"email": ANN}]})
        assert again.json()["status"] == "rejected", again.text
        assert ANN not in again.text
    async with mcp_client(service, account.api_key) as agent:
        preview = await call(agent, "send_email", **draft)
        assert preview["confirmation_token"] is None and preview["issues"]
    clock.jump(3600 + 20)  # the complaint that was due: gone with the outcome
    await service.settled()

    assert await db.read(holding, ANN) == []
    assert await db.read(holding, SCRIPTED) == []
    if database_url.startswith("sqlite"):
        assert _files_holding(database_url, ANN) == []
        assert _files_holding(database_url, SCRIPTED) == []


async def test_an_erased_address_is_never_overridden(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "erase.example")
    assert (await account.client.post("/v1/privacy/erase", json={"email": ANN})).status_code == 200
    for _ in range(3):  # a plain suppression lets the second attempt through
        sent = await account.client.post("/v1/emails/", json=message([BOB, ANN]))
        assert sent.json()["status"] == "rejected"
        detail = await account.client.get(f"/v1/emails/{sent.json()['id']}")
        assert ANN not in detail.text and BOB in detail.text and "erased.invalid" in detail.text
    retried = await account.client.post(f"/v1/emails/{sent.json()['id']}/retry")
    assert retried.json().get("status") != "queued", retried.text
    await service.settled()
    assert smtp_sink.messages == []


async def test_mail_still_to_be_tried_is_cancelled_by_erasure(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "erase.example")
    smtp_sink.fail_first(ANN, 5, code=451)
    sent = (await account.client.post("/v1/emails/", json=message([ANN, BOB]))).json()
    await wait_for_status(account, sent["id"], ("deferred",))
    assert (await account.client.post("/v1/privacy/erase", json={"email": ANN})).json()[
        "emails"
    ] == 1
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "delivered"  # to Bob; Ann's part is cancelled, not pending
    assert {r["status"] for r in email["recipients"]} == {"delivered", "cancelled"}
    clock.jump(3600)  # past every back-off step that could still come
    await service.settled()
    assert [m.rcpt_to for m in smtp_sink.messages] == [(BOB,)]
    detail = await account.client.get(f"/v1/emails/{sent['id']}")
    assert ANN not in detail.text


def _plant_legacy_erasure(tx: Tx, workspace_id: str, address: str) -> None:
    digest = hashlib.sha256(f"{workspace_id}:{address}".encode()).hexdigest()
    tx.execute(
        "INSERT INTO suppressions (workspace_id, email, reason, source_email_id, created_at)"
        " VALUES (:ws, :hash, 'manual', NULL, :at)",
        {"ws": workspace_id, "hash": f"sha256:{digest}", "at": timestamp(datetime.now(UTC))},
    )


async def test_the_kept_hash_is_keyed_and_bad_input_is_422(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    client = account.client
    listed = (await client.post("/v1/contacts/", json={"name": "L"})).json()
    await client.post(f"/v1/contacts/{listed['id']}/contacts", json={"email": ANN})
    for bad in ("%@%", "%", "ann", "@erase.example", "a@b@c", "ann.lee@erased.invalid"):
        refused = await client.post("/v1/privacy/erase", json={"email": bad})
        assert refused.status_code == 422, (bad, refused.text)
        assert refused.json()["code"] == "validation_error"
        assert refused.json()["errors"][0]["loc"] == ["body", "email"]
    assert (await client.get(f"/v1/contacts/{listed['id']}")).json()["contact_count"] == 1

    # Only the address standing whole is erased, and only what held it is counted.
    texts = [f"Ask {ANN} or jo{ANN}.", f"Ask jo{ANN} or {ANN}s"]
    templates = []
    for text in texts:
        made = await client.post("/v1/templates/", json={"name": "t", "text_body": text})
        assert made.status_code == 201, made.text
        templates.append(made.json()["id"])

    erased = (await client.post("/v1/privacy/erase", json={"email": ANN})).json()
    assert erased["contacts"] == 1 and erased["templates"] == 1
    stand_in = f"erased-{erased['suppression_hash'].split(':')[1][:16]}@erased.invalid"
    kept = [(await client.get(f"/v1/templates/{t}")).json()["text_body"] for t in templates]
    assert kept == [f"Ask {stand_in} or jo{ANN}.", texts[1]]
    ws = account.workspace_id
    plain = hashlib.sha256(f"{ws}:{ANN}".encode()).hexdigest()
    assert erased["suppression_hash"].startswith("hmac-sha256:")
    assert plain not in erased["suppression_hash"]  # a guess cannot be confirmed without the key

    # An address erased by an earlier release (plain hash) stays suppressed, for good, and
    # erasing it again keeps only the keyed hash.
    earlier = "earlier@erase.example"
    await service.running.runtime.db.write(_plant_legacy_erasure, ws, earlier)
    for _ in range(2):
        sent = (await client.post("/v1/emails/", json=message(earlier))).json()
        assert sent["status"] == "rejected"
    await client.post("/v1/privacy/erase", json={"email": earlier})
    kept = [s["email"] for s in (await client.get("/v1/suppressions/")).json()["items"]]
    assert len(kept) == 2 and all(k.startswith("hmac-sha256:") for k in kept)


async def test_tracking_links_are_opaque_and_keep_the_urls_query(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "erase.example")
    domain = (await account.client.get("/v1/domains/")).json()[0]
    await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"open_tracking": True, "click_tracking": True}
    )
    html = '<p><a href="https://shop.example/o?id=1&amp;ref=mail">order</a></p>'
    body = message(ANN, html=html, unsubscribe=True)
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    [received] = await smtp_sink.wait_for_messages(1)
    await wait_for_status(account, sent["id"])
    links = _links(received.data)
    for link in links:
        token = link.rsplit("/", 1)[1]
        assert "." not in token
        assert all(ANN.encode() not in text for text in _texts(token.replace("-", "+")))
        assert ANN.encode() not in base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
    reader = service.client()
    jump = await reader.get(links[1].removeprefix(PUBLIC_URL))
    assert jump.status_code == 302
    assert jump.headers["location"] == "https://shop.example/o?id=1&ref=mail"


async def test_links_from_before_sealing_work_for_ninety_days(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "erase.example")
    sent = (await account.client.post("/v1/emails/", json=message(ANN))).json()
    await wait_for_status(account, sent["id"])
    secret = service.running.runtime.secret_key
    # As releases before sealing made them: readable, signed, the href taken as written.
    url = "https://shop.example/o?id=1&amp;ref=mail"
    old = tracking.sign(secret, {"k": "c", "e": sent["id"], "r": ANN, "u": url})
    assert ANN in base64.urlsafe_b64decode(old.split(".")[0] + "==").decode()
    reader = service.client()
    jump = await reader.get(f"/t/c/{old}")
    assert jump.status_code == 302
    assert jump.headers["location"] == "https://shop.example/o?id=1&ref=mail"
    events = (await account.client.get(f"/v1/emails/{sent['id']}/events")).json()
    assert [e["recipient"] for e in events if e["event_type"] == "clicked"] == [ANN]

    clock.jump(91 * 86400)
    assert (await reader.get(f"/t/c/{old}")).status_code == 404
