"""An Idempotency-Key header in a message relayed over SMTP, as on the API: smtplib against
the running relay, the sink counting what was delivered."""

from __future__ import annotations

import smtplib
from functools import partial
from typing import Any

import trio

from tests.harness.dns_server import DnsServer
from tests.harness.relay import mime, relay_account
from tests.harness.sending import SENDER, message
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority


def keyed(key: str, subject: str) -> str:
    return f"Idempotency-Key: {key}\r\n" + mime(subject)


def transact(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any], messages: list[str]
) -> list[tuple[int, bytes]]:
    """Each message sent in turn on one session; the reply to each DATA (blocking)."""
    host, port = service.submission_address
    replies = []
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.login(credential["username"], credential["password"])
        for text in messages:
            assert smtp.mail(SENDER)[0] == 250
            assert smtp.rcpt("ann@customer.example")[0] == 250
            replies.append(smtp.data(text.encode()))
    return replies


async def test_same_key_and_message_answers_the_first_id_and_sends_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    first, again = await trio.to_thread.run_sync(
        partial(transact, service, tls_ca, credential, [keyed("order-1", "Receipt")] * 2)
    )
    assert first[0] == 250 and first == again
    [received] = await smtp_sink.wait_for_messages(1)
    assert b"Idempotency-Key" not in received.data  # ours, not the recipient's
    assert b"Subject: Receipt\r\n" in received.data
    # A retry on a new connection, as a client does after a dropped one.
    [later] = await trio.to_thread.run_sync(
        partial(transact, service, tls_ca, credential, [keyed("order-1", "Receipt")])
    )
    assert later == first
    await service.settled()
    assert len(smtp_sink.messages) == 1
    listed = (await account.client.get("/v1/emails/")).json()
    assert [item["id"] for item in listed] == [first[1].decode().rsplit(" ", 1)[1]]


async def test_same_key_with_another_message_is_refused_with_the_reason(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    first, other = await trio.to_thread.run_sync(
        partial(
            transact,
            service,
            tls_ca,
            credential,
            [keyed("order-2", "Receipt"), keyed("order-2", "Another receipt")],
        )
    )
    assert first[0] == 250
    assert other[0] == 550
    assert other[1].startswith(b"5.7.0 ") and b"Idempotency-Key" in other[1]
    await smtp_sink.wait_for_messages(1)
    assert len((await account.client.get("/v1/emails/")).json()) == 1


async def test_a_key_used_on_the_api_is_the_same_key_over_smtp(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    sent = await account.client.post(
        "/v1/emails/",
        json=message("ann@customer.example"),
        headers={"Idempotency-Key": "shared-key"},
    )
    assert sent.status_code == 202
    [reply] = await trio.to_thread.run_sync(
        partial(transact, service, tls_ca, credential, [keyed("shared-key", "Receipt")])
    )
    assert reply[0] == 550 and reply[1].startswith(b"5.7.0")


async def test_malformed_or_repeated_key_header_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    twice = "Idempotency-Key: a\r\n" + keyed("b", "Twice")
    too_long = keyed("k" * 257, "Long")
    replies = await trio.to_thread.run_sync(
        partial(transact, service, tls_ca, credential, [twice, too_long])
    )
    assert [code for code, _ in replies] == [550, 550]
    assert b"Idempotency-Key" in replies[0][1] and b"Idempotency-Key" in replies[1][1]
    assert (await account.client.get("/v1/emails/")).json() == []
