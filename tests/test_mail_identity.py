"""What receivers read in the mail Postroom delivers, on both engines against the SMTP sink:
tags stay internal unless the domain maps them to a header; broadcasts carry Feedback-ID and
List-Id under the DKIM signature; HTML-only mail gets a text part; a domain that asks is
signed with Ed25519 beside RSA, and dkimpy verifies both signatures of the delivered bytes."""

from __future__ import annotations

from typing import Any

import trio

from tests.harness.broadcasts import parsed, part, sender_id
from tests.harness.contacts import add_contact, create_list
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDING_DOMAIN, dkim_verifies, message, ready_account, route_mail
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink


async def _verifies(data: bytes, dns_server: DnsServer, index: int = 0) -> bool:
    return await trio.to_thread.run_sync(dkim_verifies, data, dns_server, index)


def _signatures(data: bytes) -> list[dict[str, str]]:
    """The tags of each DKIM-Signature header, top first (a= and h= are what matter here)."""
    return [
        {k.strip(): "".join(v.split()) for k, _, v in (t.partition("=") for t in str(f).split(";"))}
        for f in parsed(data).get_all("DKIM-Signature") or []
    ]


async def _domain(account: Account) -> dict[str, Any]:
    [domain] = (await account.client.get("/v1/domains/")).json()
    assert isinstance(domain, dict)
    return domain


async def test_tags_stay_internal_unless_the_domain_maps_them_to_a_header(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "people.example")
    tagged = message("ann@people.example", tags=["receipts", "eu-west"])
    await account.client.post("/v1/emails/", json=tagged)
    [first] = await smtp_sink.wait_for_messages(1)
    assert b"receipts" not in first.data  # neither X-Postroom-Tags nor any other header

    domain = await _domain(account)
    path = f"/v1/domains/{domain['id']}"
    for bad in ("Subject", "X Tags", "X-" + "t" * 70):
        refused = await account.client.patch(path, json={"tags_header": bad})
        assert refused.status_code == 422, bad
        assert refused.json()["errors"][0]["loc"] == ["body", "tags_header"]
    mapped = await account.client.patch(path, json={"tags_header": "X-Tags"})
    assert mapped.json()["tags_header"] == "X-Tags"
    await account.client.post("/v1/emails/", json=tagged)
    second = (await smtp_sink.wait_for_messages(2))[1]
    assert parsed(second.data)["X-Tags"] == "receipts, eu-west"
    assert await _verifies(second.data, dns_server)

    cleared = await account.client.patch(path, json={"tags_header": None})
    assert cleared.json()["tags_header"] is None


async def test_html_only_mail_gets_a_text_part_made_from_the_html(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "people.example")
    html = (
        "<html><body><h1>Your order</h1><p>Thanks, <b>Ann</b>.</p>"
        '<ul><li>Tea</li><li>Cake</li></ul><p><a href="https://shop.example/o/1">Track it</a>'
        "</p><img src='https://shop.example/logo.png'></body></html>"
    )
    sent = message("ann@people.example", html=html)
    del sent["text"]
    await account.client.post("/v1/emails/", json=sent)
    [received] = await smtp_sink.wait_for_messages(1)
    mail = parsed(received.data)
    assert mail.get_content_type() == "multipart/alternative"
    text = part(mail, "plain")
    for words in ("Your order", "Thanks, Ann.", "* Tea", "* Cake", "https://shop.example/o/1"):
        assert words in text
    assert "<" not in text.replace("<https", "")
    assert "Track it" in part(mail, "html")
    assert await _verifies(received.data, dns_server)


async def test_broadcast_mail_carries_a_signed_feedback_id_and_list_id(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customers.example")
    contact_list = await create_list(account)
    await add_contact(account, contact_list["id"], "ann@customers.example", name="Ann")
    sender = await sender_id(account)
    response = await account.client.post(
        f"/v1/contacts/{contact_list['id']}/send",
        json={
            "contact_list_id": contact_list["id"],
            "sender_address_id": sender,
            "subject": "News",
            "text": "Hello {{name}}",
        },
    )
    assert response.status_code == 200, response.text
    [broadcast] = (await account.client.get("/v1/broadcasts/")).json()
    [received] = await smtp_sink.wait_for_messages(1)
    mail = parsed(received.data)
    workspace = account.workspace_id
    assert mail["Feedback-ID"] == f"{broadcast['id']}:{workspace}:{sender}"
    assert mail["List-Id"] == f"<{contact_list['id']}.{SENDING_DOMAIN}>"
    [signature] = _signatures(received.data)
    assert {"feedback-id", "list-id"} <= set(signature["h"].lower().split(":"))
    assert await _verifies(received.data, dns_server)

    # Transactional mail is no list mail.
    await account.client.post("/v1/emails/", json=message("bob@customers.example"))
    second = (await smtp_sink.wait_for_messages(2))[1]
    assert parsed(second.data)["Feedback-ID"] is None
    assert parsed(second.data)["List-Id"] is None


async def test_a_domain_signing_with_ed25519_sends_two_signatures_that_both_verify(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "people.example")
    domain = await _domain(account)
    assert domain["ed25519_signing"] is False
    assert len([r for r in domain["dns_records"] if r["purpose"] == "dkim"]) == 1

    turned_on = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"ed25519_signing": True}
    )
    assert turned_on.status_code == 200, turned_on.text
    rsa_record, ed_record = [r for r in turned_on.json()["dns_records"] if r["purpose"] == "dkim"]
    assert rsa_record["required"] and not ed_record["required"]
    assert ed_record["value"].startswith("v=DKIM1; k=ed25519; p=")
    assert ed_record["host"].endswith(f"._domainkey.{SENDING_DOMAIN}")
    assert ed_record["host"] != rsa_record["host"]
    dns_server.set(ed_record["host"], "TXT", [ed_record["value"]])
    verified = (await account.client.post(f"/v1/domains/{domain['id']}/verify")).json()
    assert verified["status"] == "verified"
    ed_status = [r for r in verified["dns_records"] if r["host"] == ed_record["host"]]
    assert ed_status[0]["status"] == "verified"

    await account.client.post("/v1/emails/", json=message("ann@people.example"))
    [received] = await smtp_sink.wait_for_messages(1)
    signatures = _signatures(received.data)
    assert [s["a"] for s in signatures] == ["ed25519-sha256", "rsa-sha256"]
    assert await _verifies(received.data, dns_server, 0)  # Ed25519 (RFC 8463)
    assert await _verifies(received.data, dns_server, 1)  # RSA

    # Turned off, the key stays (its record may stay published) and mail is signed by RSA only.
    await account.client.patch(f"/v1/domains/{domain['id']}", json={"ed25519_signing": False})
    await account.client.post("/v1/emails/", json=message("bob@people.example"))
    second = (await smtp_sink.wait_for_messages(2))[1]
    assert [s["a"] for s in _signatures(second.data)] == ["rsa-sha256"]
    again = await _domain(account)
    assert [r["host"] for r in again["dns_records"] if r["purpose"] == "dkim"][1] == ed_record[
        "host"
    ]
