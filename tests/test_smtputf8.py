"""International mail end to end (RFC 6531, 6532, 2047): smtplib through the relay and the
API, the sink offering SMTPUTF8 or not, dkimpy verifying what the sink got."""

from __future__ import annotations

import email
import email.policy
import smtplib
from functools import partial
from typing import Any

import pytest
import trio

from engine.mail.international import CannotDowngrade, downgrade
from tests.harness.dns_server import DnsServer
from tests.harness.relay import relay_account
from tests.harness.sending import (
    SENDER,
    SENDING_DOMAIN,
    dkim_verifies,
    message,
    ready_account,
    route_mail,
)
from tests.harness.sending import wait_for_status as final_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import ReceivedMessage, SmtpSink
from tests.harness.tls import TlsAuthority

SUBJECT = "R\u00e9union \u4f1a\u8b70 \U0001f600 " + " ".join(["d\u00e9j\u00e0 vu"] * 8)  # folds
LOCAL = "j\u00f6s\u00e9@customer.example"  # a UTF-8 local part: only SMTPUTF8 carries it


def raw(subject: str = SUBJECT, to: str = "ann@customer.example") -> bytes:
    return (
        f"From: Z\u00f6e <{SENDER}>\r\nTo: {to}\r\nSubject: {subject}\r\n\r\nHello there.\r\n"
    ).encode()


def relay(
    service: Service,
    tls_ca: TlsAuthority,
    credential: dict[str, Any],
    recipients: list[str],
    data: bytes,
    *,
    smtputf8: bool,
) -> tuple[int, str]:
    """Submit `data` as a mail client does (blocking); the reply to the message."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.ehlo()
        assert smtp.has_extn("smtputf8")
        smtp.login(credential["username"], credential["password"])
        smtp.mail(SENDER, ["SMTPUTF8"] if smtputf8 else [])
        for recipient in recipients:
            code, _ = smtp.rcpt(recipient)
            assert code == 250, recipient
        code, text = smtp.data(data)
        return code, text.decode()


async def sending_account(service: Service, dns_server: DnsServer) -> Account:
    """An account with a verified domain and sender, mail to customer.example routed."""
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    return account


def parsed(received: ReceivedMessage) -> email.message.EmailMessage:
    return email.message_from_bytes(received.data, policy=email.policy.default)


def header(received: ReceivedMessage) -> bytes:
    return received.data.split(b"\r\n\r\n")[0]


async def test_relay_with_smtputf8_goes_as_utf8_where_offered_and_downgraded_where_not(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    smtp_sink.smtputf8 = True
    submit = partial(relay, service, tls_ca, credential, smtputf8=True)
    code, _ = await trio.to_thread.run_sync(submit, ["ann@customer.example", LOCAL], raw())
    assert code == 250
    [utf8] = await smtp_sink.wait_for_messages(1)
    assert utf8.smtputf8 and sorted(utf8.rcpt_to) == sorted(["ann@customer.example", LOCAL])
    assert f"Subject: {SUBJECT}\r\n".encode() in utf8.data  # as sent: raw UTF-8
    assert await trio.to_thread.run_sync(dkim_verifies, utf8.data, dns_server)

    smtp_sink.smtputf8 = False  # the next hop does not take UTF-8 headers
    smtp_sink.hang_up()  # from its next connection on: the one kept idle is dropped
    code, _ = await trio.to_thread.run_sync(submit, ["bob@customer.example"], raw())
    assert code == 250
    [_, downgraded] = await smtp_sink.wait_for_messages(2)
    assert not downgraded.smtputf8 and header(downgraded).isascii()
    assert parsed(downgraded)["subject"] == SUBJECT
    assert parsed(downgraded)["from"].addresses[0].display_name == "Z\u00f6e"
    assert await trio.to_thread.run_sync(dkim_verifies, downgraded.data, dns_server)


async def test_relay_without_smtputf8_encodes_utf8_headers_and_refuses_the_rest(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    smtp_sink.smtputf8 = True  # offered, yet the client did not ask for it
    submit = partial(relay, service, tls_ca, credential, ["ann@customer.example"], smtputf8=False)
    code, text = await trio.to_thread.run_sync(submit, raw())
    assert code == 250
    [received] = await smtp_sink.wait_for_messages(1)
    assert not received.smtputf8 and header(received).isascii()
    assert parsed(received)["subject"] == SUBJECT
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
    email_id = text.split()[-1]
    shown = (await account.client.get(f"/v1/emails/{email_id}")).json()
    assert shown["subject"] == SUBJECT

    latin1 = raw().replace(SUBJECT.encode(), "caf\u00e9".encode("latin-1"))
    code, text = await trio.to_thread.run_sync(submit, latin1)
    assert (code, text.split()[0]) == (554, "5.6.7") and "not UTF-8" in text
    utf8_local = raw(to=LOCAL)  # a header address no ASCII form can carry
    code, text = await trio.to_thread.run_sync(submit, utf8_local)
    assert (code, text.split()[0]) == (554, "5.6.7") and "SMTPUTF8" in text
    assert len(smtp_sink.messages) == 1


async def test_api_utf8_local_part_needs_smtputf8_and_fails_cleanly_without_it(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await sending_account(service, dns_server)
    smtp_sink.smtputf8 = True
    body = message([LOCAL, "ann@customer.example"], subject=SUBJECT)
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.smtputf8 and LOCAL in received.rcpt_to
    assert parsed(received)["subject"] == SUBJECT
    assert LOCAL.encode() in header(received)
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
    assert (await final_status(account, sent["id"]))["status"] == "delivered"

    smtp_sink.smtputf8 = False
    smtp_sink.hang_up()  # from its next connection on: the one kept idle is dropped
    sent = (await account.client.post("/v1/emails/", json=message(LOCAL))).json()
    failed = await final_status(account, sent["id"])
    assert [r["status"] for r in failed["recipients"]] == ["failed"]
    assert "5.6.7" in failed["events"][-1]["metadata"]["response"]
    # The header of the copy to an ASCII address names the UTF-8 one: no ASCII form either.
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    failed = await final_status(account, sent["id"])
    assert {r["status"] for r in failed["recipients"]} == {"failed"}
    assert (await account.client.get("/v1/suppressions/")).json()["items"] == []
    assert len(smtp_sink.messages) == 1


async def test_inbound_mx_takes_utf8_headers_and_refuses_what_is_not_utf8(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await sending_account(service, dns_server)
    sent = (await account.client.post("/v1/emails/", json=message("ann@customer.example"))).json()
    await smtp_sink.wait_for_messages(1)
    bounce_to = f"bounces+{sent['id']}@{SENDING_DOMAIN}"  # an address the MX takes mail for
    host, port = service.inbound_address

    def deliver(data: bytes, options: list[str]) -> tuple[int, str]:
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.ehlo()
            assert smtp.has_extn("smtputf8")
            smtp.mail("", options)
            assert smtp.rcpt(bounce_to)[0] == 250
            code, text = smtp.data(data)
            return code, text.decode()

    latin1 = "From: mx@far.example\r\nSubject: caf\u00e9\r\n\r\nx\r\n".encode("latin-1")
    for options in ([], ["SMTPUTF8"]):
        code, text = await trio.to_thread.run_sync(deliver, latin1, options)
        assert (code, text.split()[0]) == (554, "5.6.7") and "not UTF-8" in text
    utf8 = latin1.decode("latin-1").encode()
    for options in ([], ["SMTPUTF8"]):
        code, _ = await trio.to_thread.run_sync(deliver, utf8, options)
        assert code == 250


def test_downgrade_keeps_ascii_fields_and_encodes_the_rest() -> None:
    kept = b"Message-ID: <a@b.example>\r\nX-Ascii: as\r\n  it was\r\n"
    utf8 = (
        (
            "From: Z\u00f6e <zoe@b\u00fccher.example>, Team: ann@a.example, b@b.example;\r\n"
            "Subject: d\u00e9j\u00e0 =?utf-8?q?vu?=\r\n"
        ).encode()
        + kept
        + "\r\n\u00e9t\u00e9 body\r\n".encode()
    )
    downgraded = downgrade(utf8)
    head, body = downgraded.split(b"\r\n\r\n")
    assert head.isascii() and kept in downgraded and body == "\u00e9t\u00e9 body\r\n".encode()
    parsed = email.message_from_bytes(downgraded, policy=email.policy.default)
    assert parsed["subject"] == "d\u00e9j\u00e0 vu"  # an encoded word already there is read
    assert [str(a) for a in parsed["from"].addresses] == [
        "Z\u00f6e <zoe@xn--bcher-kva.example>",
        "ann@a.example",
        "b@b.example",
    ]


@pytest.mark.parametrize(
    ("header", "reason"),
    [
        ("To: j\u00f6s\u00e9@customer.example".encode(), "non-ASCII local part"),
        ("Message-ID: <\u00e9@x.example>".encode(), "Message-ID field"),
        ("Subject: caf\u00e9".encode("latin-1"), "not UTF-8"),
    ],
)
def test_downgrade_says_what_has_no_ascii_form(header: bytes, reason: str) -> None:
    with pytest.raises(CannotDowngrade, match=reason):
        downgrade(header + b"\r\nFrom: a@b.example\r\n\r\nbody\r\n")
