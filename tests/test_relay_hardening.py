"""The relay cannot be turned against other tenants: smtplib and raw sockets against the real
submission and inbound listeners.

A submitted message must name its author as the credential's workspace registered it (no
second From, no foreign address in From or Sender, however the header is written); a
credential deleted through the API stops its open sessions; one client address cannot hold
more than 20 connections of a listener.
"""

from __future__ import annotations

import smtplib
from functools import partial
from typing import Any, cast

import pytest
import trio
from trio.testing import MockClock

from engine.mail.address_list import addresses
from relay.listener import S421_TOO_MANY_FROM_CLIENT
from tests.harness.dns_server import DnsServer
from tests.harness.relay import relay_account, reply_line, submit
from tests.harness.sending import SENDER, SENDING_DOMAIN, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

OTHER_DOMAIN = "other-tenant.example"
FOREIGN = f"ceo@{OTHER_DOMAIN}"  # another workspace's sender, where a test registers it
TO = "ann@customer.example"


async def other_tenant(service: Service, dns_server: DnsServer) -> Account:
    """A second workspace with its own verified domain and registered sender FOREIGN."""
    account = await service.account("starter")
    domain = (await account.client.post("/v1/domains/", json={"name": OTHER_DOMAIN})).json()
    dkim_record = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim_record["host"], "TXT", [dkim_record["value"]])
    verified = await account.client.post(f"/v1/domains/{domain['id']}/verify")
    assert verified.json()["status"] == "verified"
    created = await account.client.post("/v1/senders/", json={"email": FOREIGN})
    assert created.status_code == 201
    return account


def message(originators: str, subject: str = "Invoice") -> str:
    """A message whose originator fields are `originators` (CRLF-separated header lines)."""
    return f"{originators}\r\nTo: {TO}\r\nSubject: {subject}\r\n\r\nPlease pay.\r\n"


async def refused_data(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any], data: str
) -> tuple[int, bytes]:
    """Submit `data`; the reply refusing its DATA (fails if anything else happens)."""
    with pytest.raises(smtplib.SMTPDataError) as refused:
        await trio.to_thread.run_sync(partial(submit, service, tls_ca, credential, [TO], data))
    return refused.value.smtp_code, cast(bytes, refused.value.smtp_error)


async def assert_nothing_stored(account: Account) -> None:
    assert (await account.client.get("/v1/emails/")).json() == []


# -- The author is the tenant's, and only the tenant's --------------------------------------


async def test_a_second_from_header_naming_another_tenant_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    await other_tenant(service, dns_server)
    forged = message(f"From: Hello <{SENDER}>\r\nFrom: The CEO <{FOREIGN}>")

    code, text = await refused_data(service, tls_ca, credential, forged)

    assert code == 550
    assert text == b"5.7.1 the message has 2 From headers; it must have exactly one"
    await assert_nothing_stored(account)


async def test_a_from_header_listing_a_foreign_address_beside_the_own_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    forged = message(f"From: Hello <{SENDER}>, The CEO <{FOREIGN}>")

    code, text = await refused_data(service, tls_ca, credential, forged)

    assert code == 550
    assert text == (
        f"5.7.1 From header: {FOREIGN} is not on {SENDING_DOMAIN},"
        " the domain of this credential".encode()
    )
    await assert_nothing_stored(account)


async def test_a_sender_header_of_another_domain_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    forged = message(f"From: Hello <{SENDER}>\r\nSender: {FOREIGN}")

    code, text = await refused_data(service, tls_ca, credential, forged)

    assert code == 550
    assert text.startswith(b"5.7.1 Sender header: " + FOREIGN.encode())
    await assert_nothing_stored(account)


# Each hides a foreign author from a lenient reader, or is read differently by different
# mail programs; all are refused on one connection, the reason naming the header.
DISGUISED = {
    "folded-second-address": f"From: Hello <{SENDER}>,\r\n\tThe CEO <{FOREIGN}>",
    "lower-case-second-field": f"From: {SENDER}\r\nfrom: {FOREIGN}",
    "group-with-a-foreign-member": f"From: Board: {SENDER}, {FOREIGN};",
    "encoded-word-address": f"From: {SENDER}, =?utf-8?q?ceo=40{OTHER_DOMAIN}?=",
    "unquoted-address-as-display-name": f"From: {SENDER} <{FOREIGN}>",
    "angle-address-after-a-comment": f"From: {SENDER} (Hello) <{FOREIGN}>",
    "second-sender-field": f"From: {SENDER}\r\nSender: {SENDER}\r\nSENDER: {FOREIGN}",
    "sender-listing-two-addresses": f"From: {SENDER}\r\nSender: {SENDER}, {FOREIGN}",
    "empty-group": "From: Undisclosed:;",
}


async def test_from_and_sender_headers_disguising_a_foreign_author_are_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)

    def converse() -> dict[str, tuple[int, bytes]]:
        host, port = service.submission_address
        replies = {}
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.starttls(context=tls_ca.client_context())
            smtp.login(credential["username"], credential["password"])
            for case, originators in DISGUISED.items():
                try:
                    smtp.sendmail(SENDER, [TO], message(originators, case))
                    replies[case] = (250, b"")
                except smtplib.SMTPDataError as refused:
                    replies[case] = (refused.smtp_code, cast(bytes, refused.smtp_error))
        return replies

    replies = await trio.to_thread.run_sync(converse)

    for case, (code, text) in replies.items():
        assert code == 550, case
        assert text.startswith(b"5.7.1 "), case
        assert b"From" in text or b"Sender" in text, case
    await assert_nothing_stored(account)


@pytest.mark.parametrize(
    ("value", "read"),
    [
        ('"Doe, John" (billing) <john@a.example>', ["john@a.example"]),
        ("=?utf-8?q?b=40b.example?= <a@a.example>", ["a@a.example"]),
        ("John Q. Public <j@a.example>, k(comment)@a.example", ["j@a.example", "k@a.example"]),
        ("Team: a@a.example, <b@b.example>;", ["a@a.example", "b@b.example"]),
        ("Undisclosed:;", []),
        ("a@a.example <b@b.example>", None),
        ("<a@a.example> <b@b.example>", None),
        ("a@a.example b@b.example", None),
        ("a@a.example; b@b.example", None),
        ("=?utf-8?q?b=40b.example?=", None),
        ("a@b.example@a.example", None),
        ("Name <@relay.example:a@a.example>", None),
        ('"unclosed <a@a.example>', None),
        ("a@a.example (unclosed", None),
        ("a@a.example,", None),
        ("", None),
    ],
)
def test_address_lists_are_read_strictly(value: str, read: list[str] | None) -> None:
    """What a lenient parser guesses at, and mail programs read differently, is None."""
    assert addresses(value) == read


async def test_a_well_formed_message_is_accepted_and_reaches_the_recipient_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    # Folded, with an encoded display name, a comment and a Sender: all legitimate.
    honest = message(
        f"FROM: =?utf-8?q?Caf=C3=A9?= (billing)\r\n <{SENDER.upper()}>\r\nSender: {SENDER}"
    )

    refused = await trio.to_thread.run_sync(
        partial(submit, service, tls_ca, credential, [TO], honest)
    )

    assert refused == {}
    [listed] = (await account.client.get("/v1/emails/")).json()
    assert (await wait_for_status(account, listed["id"]))["status"] == "delivered"
    [received] = smtp_sink.messages
    assert received.rcpt_to == (TO,)
    assert f"<{SENDER.upper()}>".encode() in received.data


# -- A deleted credential ends its sessions ---------------------------------------------------


def _open_session(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any]
) -> smtplib.SMTP:
    host, port = service.submission_address
    smtp = smtplib.SMTP(host, port, timeout=15)
    smtp.starttls(context=tls_ca.client_context())
    smtp.login(credential["username"], credential["password"])
    return smtp


async def test_deleting_a_credential_refuses_the_next_mail_from_of_its_open_session(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority, clock: MockClock
) -> None:
    account, credential = await relay_account(service, dns_server)
    smtp = await trio.to_thread.run_sync(_open_session, service, tls_ca, credential)
    try:
        sent = partial(smtp.sendmail, SENDER, [TO], message(f"From: {SENDER}"))
        assert await trio.to_thread.run_sync(sent) == {}  # the session works

        deleted = await account.client.delete(f"/v1/smtp-credentials/{credential['id']}")
        assert deleted.status_code == 204
        service.clock.jump(1.0)  # the most a session's view of its credential may lag

        code, text = await trio.to_thread.run_sync(smtp.mail, SENDER)
        assert (code, text) == (535, b"5.7.8 Authentication credentials invalid")
        code, _ = await trio.to_thread.run_sync(smtp.mail, SENDER)
        assert code == 535  # and stays so for the rest of the connection
    finally:
        await trio.to_thread.run_sync(smtp.close)
    assert len((await account.client.get("/v1/emails/")).json()) == 1


async def test_a_message_in_progress_when_its_credential_is_deleted_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    smtp = await trio.to_thread.run_sync(_open_session, service, tls_ca, credential)
    try:
        assert (await trio.to_thread.run_sync(smtp.mail, SENDER))[0] == 250
        assert (await trio.to_thread.run_sync(smtp.rcpt, TO))[0] == 250

        deleted = await account.client.delete(f"/v1/smtp-credentials/{credential['id']}")
        assert deleted.status_code == 204

        data = message(f"From: {SENDER}").encode()
        code, text = await trio.to_thread.run_sync(smtp.data, data)
    finally:
        await trio.to_thread.run_sync(smtp.close)
    assert code == 550
    assert text.startswith(b"5.7.1 this SMTP credential has been deleted")
    await assert_nothing_stored(account)


# -- One client address cannot take every connection ----------------------------------------


@pytest.mark.parametrize("listener", ["submission", "inbound"])
async def test_the_twenty_first_connection_from_one_address_is_told_421(
    service: Service, listener: str
) -> None:
    host, port = getattr(service, f"{listener}_address")
    held = [await trio.open_tcp_stream(host, port) for _ in range(20)]
    try:
        for stream in held:
            assert (await reply_line(stream)).startswith(b"220 ")

        extra = await trio.open_tcp_stream(host, port)
        assert await reply_line(extra) == S421_TOO_MANY_FROM_CLIENT.to_bytes()
        with trio.fail_after(10):
            assert await extra.receive_some() == b""  # closed
        await extra.aclose()

        for stream in held:  # the twenty are still served
            await stream.send_all(b"NOOP\r\n")
            assert await reply_line(stream) == b"250 2.0.0 OK\r\n"

        await held[0].send_all(b"QUIT\r\n")
        assert (await reply_line(held[0])).startswith(b"221 ")
        with trio.fail_after(10):
            assert await held[0].receive_some() == b""
        again = await trio.open_tcp_stream(host, port)  # a place came free
        assert (await reply_line(again)).startswith(b"220 ")
        await again.aclose()
    finally:
        for stream in held:
            await stream.aclose()

    metrics = (await service.client().get("/metrics")).text
    assert f"postroom_{listener}_connections_refused_per_client 1.0" in metrics
