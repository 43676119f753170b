"""The SMTP relay end to end: smtplib against the real listeners, the sink receiving."""

from __future__ import annotations

import trio

from engine.raw_mail import RawMail, queue_raw
from tests.harness.dns_server import DnsServer
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.test_sending import (
    SENDER,
    SENDING_DOMAIN,
    dkim_verifies,
    ready_account,
    route_mail,
    wait_for_status,
)

RAW = (
    f"From: Hello <{SENDER}>\r\n"
    "To: Ann <ann@customer.example>\r\n"
    "Subject: Raw =?utf-8?q?caf=C3=A9?=\r\n"
    "Bcc: secret@customer.example\r\n"
    "\r\n"
    "Sent as given.\r\n"
).encode()


async def test_queued_raw_mail_is_delivered_signed_and_completed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    [domain] = (await account.client.get("/v1/domains/")).json()
    mail = RawMail(
        account.workspace_id,
        domain["id"],
        SENDER,
        ["ann@customer.example", "secret@customer.example"],
        RAW,
        "smtp",
    )
    email_id = await queue_raw(service.running.runtime, mail)

    [received] = await smtp_sink.wait_for_messages(1)
    assert sorted(received.rcpt_to) == ["ann@customer.example", "secret@customer.example"]
    assert received.mail_from == f"bounces+{email_id}@{SENDING_DOMAIN}"
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
    assert b"\r\nMessage-ID: <" in b"\r\n" + received.data
    assert b"\r\nDate: " in received.data
    assert b"Bcc:" not in received.data
    assert received.data.endswith(b"\r\n\r\nSent as given.\r\n")

    email = await wait_for_status(account, email_id)
    assert email["status"] == "delivered"
    assert email["source"] == "smtp"
    assert email["subject"] == "Raw café"
    assert email["from_address"] == SENDER
    assert email["from_name"] == "Hello"
    assert email["to_addresses"] == ["ann@customer.example"]
    assert [b["email"] for b in email["bcc"]] == ["secret@customer.example"]
    assert email["message_id"].endswith(f"@{SENDING_DOMAIN}>")
    assert email["message_id"].encode() in received.data
