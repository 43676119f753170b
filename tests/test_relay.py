"""The SMTP relay end to end: smtplib against the real listeners, the sink receiving."""

from __future__ import annotations

import base64
import smtplib
import socket
import ssl
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import cast

import pytest
import trio
import trio.testing
from cryptography import x509
from trio.testing import MockClock

from engine.platform.runtime import Runtime
from engine.sending.raw_mail import RawMail, queue_raw
from engine.smtp.server import ServerPolicy, SmtpServer
from relay import submission
from relay.connection import ShutdownSignal, Timeouts, drive
from relay.inbound import InboundSession
from relay.listener import SmtpListener
from relay.tls import server_context
from storage import accounts, migrations
from storage.database import open_database
from storage.sealing import Sealer
from tests.harness.dns_server import DnsServer
from tests.harness.relay import mime, relay_account, submit
from tests.harness.sending import (
    SENDER,
    SENDING_DOMAIN,
    dkim_verifies,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import SMTP_HOST, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

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


# -- Submission over smtplib --------------------------------------------------------------


async def test_submission_with_auth_plain_and_login_arrives_dkim_signed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    for mechanism in ("PLAIN", "LOGIN"):
        refused = await trio.to_thread.run_sync(
            partial(
                submit,
                service,
                tls_ca,
                credential,
                ["ann@customer.example"],
                mime(f"Via {mechanism}"),
                mechanism=mechanism,
            )
        )
        assert refused == {}
    received = await smtp_sink.wait_for_messages(2)
    assert sorted(m.data.split(b"Subject: ")[1].split(b"\r\n")[0] for m in received) == [
        b"Via LOGIN",
        b"Via PLAIN",
    ]
    for message in received:
        assert message.rcpt_to == ("ann@customer.example",)
        assert message.mail_from.startswith("bounces+")
        assert message.mail_from.endswith(f"@{SENDING_DOMAIN}")
        assert await trio.to_thread.run_sync(dkim_verifies, message.data, dns_server)
    listed = (await account.client.get("/v1/emails/")).json()
    assert sorted(item["subject"] for item in listed) == ["Via LOGIN", "Via PLAIN"]
    assert {item["source"] for item in listed} == {"smtp"}
    for item in listed:
        assert (await wait_for_status(account, item["id"]))["status"] == "delivered"
    metrics = (await service.client().get("/metrics")).text
    assert "postroom_submission_messages_accepted 2.0" in metrics


def _plain_token(username: str, password: str) -> str:
    return base64.b64encode(f"\0{username}\0{password}".encode()).decode()


async def test_auth_before_tls_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)

    def converse() -> list[tuple[int, bytes]]:
        host, port = service.submission_address
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.ehlo()
            assert smtp.has_extn("starttls") and not smtp.has_extn("auth")
            token = _plain_token(credential["username"], credential["password"])
            return [smtp.docmd("AUTH", f"PLAIN {token}"), smtp.docmd("MAIL", f"FROM:<{SENDER}>")]

    auth, mail = await trio.to_thread.run_sync(converse)
    assert auth[0] == 530 and auth[1].startswith(b"5.7.0")
    assert mail[0] == 530


async def test_wrong_password_and_deactivated_credential_get_535(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    wrong = dict(credential, password=credential["password"] + "x")
    for bad in (wrong, dict(credential, username="nobody@" + SENDING_DOMAIN)):
        with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
            await trio.to_thread.run_sync(
                partial(submit, service, tls_ca, bad, ["ann@customer.example"], mime("x"))
            )
        assert refused.value.smtp_code == 535
    deleted = await account.client.delete(f"/v1/smtp-credentials/{credential['id']}")
    assert deleted.status_code == 204
    with pytest.raises(smtplib.SMTPAuthenticationError) as refused:
        await trio.to_thread.run_sync(
            partial(submit, service, tls_ca, credential, ["ann@customer.example"], mime("x"))
        )
    assert refused.value.smtp_code == 535
    assert cast(bytes, refused.value.smtp_error).startswith(b"5.7.8")


async def test_unregistered_sender_is_refused(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    for sender in (f"stranger@{SENDING_DOMAIN}", "hello@elsewhere.example"):
        with pytest.raises(smtplib.SMTPSenderRefused) as refused:
            await trio.to_thread.run_sync(
                partial(
                    submit,
                    service,
                    tls_ca,
                    credential,
                    ["ann@customer.example"],
                    mime("x"),
                    mail_from=sender,
                )
            )
        assert refused.value.smtp_code == 550
        assert refused.value.smtp_error.startswith(b"5.7.1")


async def test_messages_stored_together_are_each_answered_as_if_alone(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    from engine import plans
    from storage import emails as stored_emails

    # Messages that meet in one group commit are checked and stored together: with room
    # for two more emails this month, two of four are accepted; a forged From is refused.
    account, credential = await relay_account(service, dns_server)
    month = service.running.runtime.clock.now().strftime("%Y-%m")
    room_for_two = plans.plan("starter").emails_per_month - 2
    await service.running.runtime.db.write(
        stored_emails.count_sent, account.workspace_id, month, room_for_two, 1
    )
    messages = [mime(f"fine {i}") for i in range(4)] + [
        mime("forged", sender="boss@elsewhere.example")
    ]
    answers: list[int] = [0] * len(messages)

    def send(i: int) -> None:
        try:
            submit(service, tls_ca, credential, ["ann@customer.example"], messages[i])
            answers[i] = 250
        # Refused at DATA when stored; at MAIL FROM for a connection that authenticated
        # after the volume had filled.
        except (smtplib.SMTPDataError, smtplib.SMTPSenderRefused) as refused:
            answers[i] = refused.smtp_code

    async with trio.open_nursery() as nursery:
        for i in range(len(messages)):
            nursery.start_soon(partial(trio.to_thread.run_sync, send, i))

    assert sorted(answers[:4]) == [250, 250, 550, 550]
    assert answers[4] == 550
    assert len((await account.client.get("/v1/emails/")).json()) == 2


async def test_suppressed_recipient_is_refused_then_accepted_once_within_24_hours(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    account, credential = await relay_account(service, dns_server)
    added = await account.client.post("/v1/suppressions/", json={"email": "gone@customer.example"})
    assert added.status_code in (200, 201)
    send = partial(submit, service, tls_ca, credential, ["gone@customer.example"], mime("again"))

    with pytest.raises(smtplib.SMTPRecipientsRefused) as first:
        await trio.to_thread.run_sync(send)
    code, text = first.value.recipients["gone@customer.example"]
    assert code == 550 and text.startswith(b"5.7.1") and b"suppressed" in text
    assert await trio.to_thread.run_sync(send) == {}  # the one retry within 24 hours
    with pytest.raises(smtplib.SMTPRecipientsRefused):
        await trio.to_thread.run_sync(send)
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == ("gone@customer.example",)


async def test_message_over_the_size_limit_gets_552(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)

    def converse() -> tuple[int, bytes]:
        host, port = service.submission_address
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.starttls(context=tls_ca.client_context())
            smtp.login(credential["username"], credential["password"])
            limit = int(smtp.esmtp_features["size"])
            assert limit == submission.MAX_MESSAGE_SIZE
            return smtp.mail(SENDER, [f"SIZE={limit + 1}"])

    code, text = await trio.to_thread.run_sync(converse)
    assert code == 552 and text.startswith(b"5.3.4")


# -- Raw conversations: smuggling and STARTTLS injection ----------------------------------


class RawClient:
    """A line-level client on a blocking socket, for what smtplib will not send."""

    def __init__(self, address: tuple[str, int]) -> None:
        self.sock: socket.socket | ssl.SSLSocket = socket.create_connection(address, timeout=15)
        self.buffer = b""
        self.reply()  # the greeting

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def reply(self) -> tuple[int, bytes]:
        """The next complete reply: its code and its last line."""
        while True:
            end = self.buffer.find(b"\r\n")
            if end < 0:
                chunk = self.sock.recv(65536)
                if not chunk:
                    raise ConnectionError("closed")
                self.buffer += chunk
                continue
            line, self.buffer = self.buffer[:end], self.buffer[end + 2 :]
            if line[3:4] != b"-":
                return int(line[:3]), line[4:]

    def command(self, line: bytes) -> tuple[int, bytes]:
        self.send(line + b"\r\n")
        return self.reply()

    def start_tls(self, tls_ca: TlsAuthority) -> None:
        self.command(b"EHLO raw.test")
        assert self.command(b"STARTTLS")[0] == 220
        self.sock = tls_ca.client_context().wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.command(b"EHLO raw.test")

    def close(self) -> None:
        self.sock.close()


@pytest.mark.parametrize(
    "smuggled",
    [b"\n.\n", b"\r.\r\n", b"\n.\r\n"],
    ids=["lf-dot-lf", "cr-dot-crlf", "lf-dot-crlf"],
)
async def test_smuggled_end_of_data_never_yields_a_second_message(
    service: Service,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    smuggled: bytes,
) -> None:
    account, credential = await relay_account(service, dns_server)

    def converse() -> list[tuple[int, bytes]]:
        client = RawClient(service.submission_address)
        try:
            client.start_tls(tls_ca)
            token = _plain_token(credential["username"], credential["password"])
            assert client.command(f"AUTH PLAIN {token}".encode())[0] == 235
            envelope = f"MAIL FROM:<{SENDER}>\r\nRCPT TO:<ann@customer.example>\r\nDATA\r\n"
            client.send(envelope.encode())
            replies = [client.reply(), client.reply(), client.reply()]
            smuggling = (
                mime("first").encode().rstrip(b"\r\n")
                + smuggled
                + f"MAIL FROM:<{SENDER}>\r\nRCPT TO:<bob@customer.example>\r\nDATA\r\n".encode()
                + mime("smuggled", to="bob@customer.example").encode()
                + b".\r\n"
            )
            client.send(smuggling)
            replies.append(client.reply())
            # The session goes on normally afterwards.
            client.send(envelope.encode())
            replies += [client.reply(), client.reply(), client.reply()]
            client.send(mime("honest").encode() + b".\r\n")
            replies.append(client.reply())
            replies.append(client.command(b"QUIT"))
            return replies
        finally:
            client.close()

    replies = await trio.to_thread.run_sync(converse)
    assert [code for code, _ in replies] == [250, 250, 354, 554, 250, 250, 354, 250, 221]
    [received] = await smtp_sink.wait_for_messages(1)
    assert b"Subject: honest" in received.data
    await service.settled()  # nothing else arrives
    assert len(smtp_sink.messages) == 1
    assert [item["subject"] for item in (await account.client.get("/v1/emails/")).json()] == [
        "honest"
    ]


async def test_command_pipelined_after_starttls_is_discarded(
    service: Service, tls_ca: TlsAuthority
) -> None:
    def converse() -> list[tuple[int, bytes]]:
        client = RawClient(service.submission_address)
        try:
            client.command(b"EHLO raw.test")
            client.send(b"STARTTLS\r\nNOOP\r\nEHLO injected.test\r\n")
            assert client.reply()[0] == 220
            assert client.buffer == b""
            client.sock = tls_ca.client_context().wrap_socket(
                client.sock, server_hostname="127.0.0.1"
            )
            # Had NOOP or the injected EHLO run, their replies would come first.
            return [client.command(b"HELO raw.test"), client.command(b"NOOP")]
        finally:
            client.close()

    helo, noop = await trio.to_thread.run_sync(converse)
    assert helo == (250, SMTP_HOST.encode())
    assert noop[0] == 250


# -- The inbound MX ------------------------------------------------------------------------


async def test_inbound_refuses_addresses_that_are_not_ours(
    service: Service, tls_ca: TlsAuthority
) -> None:
    def converse() -> tuple[int, bytes]:
        host, port = service.inbound_address
        with smtplib.SMTP(host, port, timeout=15) as smtp:
            smtp.starttls(context=tls_ca.client_context())
            smtp.ehlo()
            assert not smtp.has_extn("auth")
            smtp.mail("someone@elsewhere.example")
            return smtp.rcpt("nobody@customer.example")

    code, text = await trio.to_thread.run_sync(converse)
    assert code == 550 and text.startswith(b"5.1.1")


# -- The certificate and the driver -------------------------------------------------------


async def test_self_signed_certificate_is_generated_once_and_kept(tmp_path: Path) -> None:
    async with open_database(f"sqlite:///{tmp_path / 'postroom.db'}") as db:
        await db.transaction(migrations.apply_pending)
        db.use_master_key(Sealer(b"relay test master key"))
        now = datetime.now(UTC)
        first = await server_context(db, None, None, "relay.example.org", now)
        second = await server_context(db, None, None, "relay.example.org", now)
        pem = await db.read(accounts.secret, "relay_tls_self_signed", "unused")
    cert = x509.load_pem_x509_certificate(pem.encode())
    assert cert.subject.rfc4514_string() == "CN=relay.example.org"
    assert first.cert_store_stats() == second.cert_store_stats()


class _Tally:
    def message_done(self, accepted: bool) -> None:
        raise AssertionError("no message expected")


async def test_a_silent_client_is_told_421_and_dropped(autojump_clock: MockClock) -> None:
    client, server_side = trio.testing.memory_stream_pair()
    policy = ServerPolicy("relay.test", max_message_size=1000, tls_available=False)
    with trio.fail_after(1000):
        await drive(
            server_side,
            SmtpServer(policy),
            InboundSession(cast(Runtime, None), "127.0.0.1"),
            tls=None,
            timeouts=Timeouts(command=60),
            shutdown=ShutdownSignal(),
            tally=_Tally(),
        )
    received = await client.receive_some()
    assert received.startswith(b"220 relay.test")
    assert received.endswith(b"421 4.4.2 Timeout, closing channel\r\n")


async def test_connections_over_the_limit_are_told_421_and_counted(nursery: trio.Nursery) -> None:
    policy = ServerPolicy("relay.test", max_message_size=1000, tls_available=False)
    listener = SmtpListener(
        "test",
        ("127.0.0.1", 0),
        policy,
        lambda client: InboundSession(cast(Runtime, None), "127.0.0.1"),
        tls=None,
        max_connections=1,
    )
    host, port = await nursery.start(listener.run)
    first = await trio.open_tcp_stream(host, port)
    assert (await first.receive_some()).startswith(b"220 relay.test")
    second = await trio.open_tcp_stream(host, port)
    assert await second.receive_some() == b"421 4.7.0 Too many connections, try again later\r\n"
    assert await second.receive_some() == b""
    stats = listener.statistics()
    assert (stats.connections_open, stats.connections_total, stats.connections_refused) == (1, 2, 1)
    listener.stop()  # an idle conversation is told at once
    assert await first.receive_some() == b"421 4.3.2 Service shutting down, closing channel\r\n"
    await first.aclose()
    await second.aclose()
