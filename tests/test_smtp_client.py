"""The SMTP client: the sans-I/O machine over canned bytes, then the Trio session against
the SMTP sink (and, for servers the sink cannot imitate, a few lines of scripted server).
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections.abc import Callable
from functools import partial

import pytest
import trio
import trio.testing
import trustme

from engine.smtp import (
    NEED_DATA,
    ClientState,
    PermanentFailure,
    ProtocolError,
    SmtpClient,
    SmtpReply,
    TransientFailure,
    connect,
)
from engine.smtp.errors import SmtpError, TlsFailure
from engine.smtp.grammar import MAX_REPLY_LINE, MAX_REPLY_LINES
from engine.smtp.replies import (
    S250_OK,
    S354_START_DATA,
    S421_SHUTTING_DOWN,
    S450_MAILBOX_BUSY,
    S550_NO_SUCH_USER,
    S553_NEEDS_SMTPUTF8,
    S554_MESSAGE_NEEDS_SMTPUTF8,
)
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

HELO = "client.postroom.test"
SENDER = "bounce+1@sender.test"
MESSAGE = b"From: a@sender.test\r\nTo: b@rcpt.test\r\nSubject: hi\r\n\r\nHello.\r\n"

# -- the machine ---------------------------------------------------------------------------


def state_of(client: SmtpClient) -> ClientState:
    # A call, so that mypy does not hold on to a state narrowed by an earlier assert.
    return client.state


def ready_client(*extensions: str) -> SmtpClient:
    """A client past the greeting and an EHLO answered with ``extensions``."""
    client = SmtpClient()
    client.receive_data(b"220 mx.test ESMTP\r\n")
    assert client.next_reply() == SmtpReply.of(220, "mx.test ESMTP")
    client.ehlo(HELO)
    client.receive_data(SmtpReply.of(250, "mx.test greets you", *extensions).to_bytes())
    assert isinstance(client.next_reply(), SmtpReply)
    assert state_of(client) is ClientState.READY
    return client


def test_multiline_reply_split_across_chunks_arrives_whole() -> None:
    client = SmtpClient()
    wire = b"220-mx.test ESMTP\r\n220-no UCE\r\n220 ready\r\n"
    for i in range(len(wire) - 1):
        client.receive_data(wire[i : i + 1])
        assert client.next_reply() is NEED_DATA
    client.receive_data(wire[-1:])
    reply = client.next_reply()
    assert reply == SmtpReply(220, ("mx.test ESMTP", "no UCE", "ready"))
    assert client.next_reply() is NEED_DATA


def test_reply_reports_its_class_and_enhanced_status() -> None:
    client = ready_client()
    client.mail_from(SENDER)
    client.rcpt_to("nobody@rcpt.test")
    client.receive_data(b"250 OK\r\n550-5.1.1 no such user\r\n550 5.1.1 see the docs\r\n")
    assert client.next_reply() == SmtpReply.of(250, "OK")
    reply = client.next_reply()
    assert reply == SmtpReply(550, ("5.1.1 no such user", "5.1.1 see the docs"))
    assert reply.is_permanent and not reply.is_transient and not reply.is_positive
    assert reply.enhanced_status == "5.1.1"
    assert reply.text == "5.1.1 no such user\n5.1.1 see the docs"
    assert str(S550_NO_SUCH_USER) == "550 5.1.1 No such user"
    assert S450_MAILBOX_BUSY.is_transient and S450_MAILBOX_BUSY.enhanced_status == "4.2.0"
    assert S354_START_DATA.is_positive and not S354_START_DATA.is_success
    assert S354_START_DATA.enhanced_status is None
    assert SmtpReply.of(550, "4.1.1 class disagrees").enhanced_status is None
    assert SmtpReply.of(250, "2.0.0.1 too many parts").enhanced_status is None


def test_reply_nobody_asked_for_is_a_protocol_error() -> None:
    client = ready_client()
    client.receive_data(b"250 2.0.0 hello?\r\n")
    with pytest.raises(ProtocolError, match="nobody asked"):
        client.next_reply()


@pytest.mark.parametrize(
    "wire",
    [
        b"25O OK\r\n",  # not a number
        b"2500 OK\r\n",  # four digits
        b"250_OK\r\n",  # neither SP nor "-"
        b"150 OK\r\n",  # no such class
        b"hello\r\n",
        b"220-mx.test\r\n250 mixed codes\r\n",
        b"220 bare\rCR\r\n",
    ],
)
def test_malformed_reply_is_a_protocol_error(wire: bytes) -> None:
    client = SmtpClient()
    client.receive_data(wire)
    with pytest.raises(ProtocolError):
        client.next_reply()


def test_reply_line_over_the_cap_is_refused_before_it_ends() -> None:
    client = SmtpClient()
    client.receive_data(b"220 " + b"x" * (MAX_REPLY_LINE - 4))
    with pytest.raises(ProtocolError, match="longer than"):
        client.next_reply()


def test_reply_line_at_the_cap_is_accepted() -> None:
    client = SmtpClient()
    client.receive_data(b"220 " + b"x" * (MAX_REPLY_LINE - 6) + b"\r\n")
    reply = client.next_reply()
    assert isinstance(reply, SmtpReply) and len(reply.lines[0]) == MAX_REPLY_LINE - 6


def test_reply_of_too_many_lines_is_refused() -> None:
    client = SmtpClient()
    client.receive_data(b"220-x\r\n" * MAX_REPLY_LINES + b"220 x\r\n")
    with pytest.raises(ProtocolError, match="lines"):
        client.next_reply()


def test_connection_closed_mid_reply_is_a_protocol_error() -> None:
    client = SmtpClient()
    client.receive_data(b"220-mx.test\r\n")
    assert client.next_reply() is NEED_DATA
    client.receive_data(b"")
    with pytest.raises(ProtocolError, match="closed"):
        client.next_reply()


def test_ehlo_extensions_are_parsed_with_upper_case_keywords() -> None:
    client = ready_client(
        "pipelining", "SIZE 35882577", "8BITMIME", "AUTH=LOGIN", "AUTH PLAIN LOGIN", "STARTTLS"
    )
    assert dict(client.extensions) == {
        "PIPELINING": "",
        "SIZE": "35882577",
        "8BITMIME": "",
        "AUTH": "PLAIN LOGIN",
        "STARTTLS": "",
    }


def test_helo_after_refused_ehlo_leaves_no_extensions() -> None:
    client = SmtpClient()
    client.receive_data(b"220 old.test\r\n")
    client.next_reply()
    client.ehlo(HELO)
    client.receive_data(b"502 5.5.1 what is EHLO\r\n")
    assert client.next_reply() == SmtpReply.of(502, "5.5.1 what is EHLO")
    assert state_of(client) is ClientState.CONNECTED
    assert client.helo(HELO) == b"HELO client.postroom.test\r\n"
    client.receive_data(b"250 old.test\r\n")
    client.next_reply()
    assert state_of(client) is ClientState.READY and not client.extensions


def test_mail_from_adds_size_and_body_only_when_offered() -> None:
    plain = ready_client()
    assert plain.mail_from(SENDER, 1234, eight_bit=True) == b"MAIL FROM:<bounce+1@sender.test>\r\n"
    rich = ready_client("SIZE 1000000", "8BITMIME")
    assert rich.mail_from("", 1234, eight_bit=True) == b"MAIL FROM:<> SIZE=1234 BODY=8BITMIME\r\n"
    seven_bit = ready_client("SIZE", "8BITMIME")
    assert seven_bit.mail_from(SENDER, 5) == b"MAIL FROM:<bounce+1@sender.test> SIZE=5\r\n"


def test_non_ascii_address_needs_smtputf8() -> None:
    with pytest.raises(ValueError, match="SMTPUTF8"):
        ready_client().mail_from("jos\u00e9@sender.test")
    client = ready_client("SMTPUTF8")
    assert client.mail_from(SENDER, smtputf8=True).endswith(b" SMTPUTF8\r\n")
    assert client.rcpt_to("jos\u00e9@rcpt.test") == "RCPT TO:<jos\u00e9@rcpt.test>\r\n".encode()
    ascii_only = ready_client("SMTPUTF8")
    ascii_only.mail_from(SENDER)
    with pytest.raises(ValueError, match="smtputf8"):
        ascii_only.rcpt_to("jos\u00e9@rcpt.test")


@pytest.mark.parametrize(
    ("data", "wire"),
    [
        (b"Subject: x\r\n\r\nbody\r\n", b"Subject: x\r\n\r\nbody\r\n.\r\n"),
        (b".starts with a dot\r\n", b"..starts with a dot\r\n.\r\n"),
        (b"a\r\n.\r\nb\r\n", b"a\r\n..\r\nb\r\n.\r\n"),  # a line that is just "."
        (b"a\r\n..two\r\n", b"a\r\n...two\r\n.\r\n"),
        (b"no newline at the end", b"no newline at the end\r\n.\r\n"),
        (b"ends with a dot\r\n.", b"ends with a dot\r\n..\r\n.\r\n"),
        (b"bare\nLF\n.\nand\rCR\r\r\n", b"bare\r\nLF\r\n..\r\nand\r\nCR\r\n\r\n.\r\n"),
        (b"", b".\r\n"),
    ],
)
def test_message_is_dot_stuffed_with_crlf_line_endings(data: bytes, wire: bytes) -> None:
    client = ready_client()
    client.mail_from(SENDER)
    client.rcpt_to("b@rcpt.test")
    client.data()
    client.receive_data(b"250 2.1.0 OK\r\n250 2.1.5 OK\r\n354 go ahead\r\n")
    while state_of(client) is not ClientState.MESSAGE:
        assert isinstance(client.next_reply(), SmtpReply)
    encoded = client.message(data)
    assert encoded == wire
    assert re.search(rb"\r(?!\n)|(?<!\r)\n", encoded) is None  # never a bare CR or LF


@pytest.mark.parametrize(
    "send",
    [
        lambda c: c.mail_from("a@sender.test>\r\nRCPT TO:<victim@elsewhere.test"),
        lambda c: c.mail_from("a@sender.test> SIZE=1"),
        lambda c: c.rcpt_to("b@rcpt.test\nDATA"),
        lambda c: c.rcpt_to("<b@rcpt.test>"),
        lambda c: c.rcpt_to("b@rcpt.test\x00"),
        lambda c: c.rcpt_to(""),
        lambda c: c.ehlo("client.test\r\nMAIL FROM:<x@y>"),
        lambda c: c.ehlo("two words"),
    ],
)
def test_command_injection_is_refused(send: Callable[[SmtpClient], bytes]) -> None:
    client = ready_client()
    client.mail_from(SENDER)
    with pytest.raises(ValueError):
        send(client)
    assert state_of(client) is ClientState.MAIL  # nothing changed


def test_pipelined_replies_are_matched_to_commands_in_order() -> None:
    client = ready_client("PIPELINING")
    wire = client.mail_from(SENDER) + client.rcpt_to("a@rcpt.test") + client.rcpt_to("b@rcpt.test")
    wire += client.data()
    assert wire.count(b"\r\n") == 4 and state_of(client) is ClientState.DATA
    client.receive_data(b"250 2.1.0 OK\r\n550 5.1.1 no\r\n250 2.1.5 OK\r\n354 go ahead\r\n")
    codes = [client.next_reply() for _ in range(4)]
    assert [c.code for c in codes if isinstance(c, SmtpReply)] == [250, 550, 250, 354]
    assert state_of(client) is ClientState.MESSAGE
    client.message(MESSAGE)
    client.receive_data(S250_OK.to_bytes())
    assert client.next_reply() == S250_OK
    assert state_of(client) is ClientState.READY


def test_refused_data_needs_rset_before_the_next_transaction() -> None:
    client = ready_client("PIPELINING")
    client.mail_from(SENDER)
    client.rcpt_to("a@rcpt.test")
    client.data()
    client.receive_data(b"250 OK\r\n550 5.1.1 no\r\n554 5.5.1 no valid recipients\r\n")
    for _ in range(3):
        client.next_reply()
    assert state_of(client) is ClientState.ABORTED
    with pytest.raises(RuntimeError, match="MAIL"):
        client.mail_from(SENDER)
    assert client.rset() == b"RSET\r\n"
    assert state_of(client) is ClientState.READY


def test_commands_out_of_sequence_are_refused() -> None:
    client = SmtpClient()
    with pytest.raises(RuntimeError):
        client.ehlo(HELO)  # the server speaks first
    client = ready_client()
    with pytest.raises(RuntimeError):
        client.data()
    with pytest.raises(RuntimeError):
        client.message(MESSAGE)


@pytest.mark.parametrize(
    ("command", "wire"),
    [("mail", b"354 go ahead\r\n"), ("data", b"250 OK\r\n")],
)
def test_reply_of_the_wrong_class_is_a_protocol_error(command: str, wire: bytes) -> None:
    client = ready_client()
    client.mail_from(SENDER)
    if command == "data":
        client.rcpt_to("a@rcpt.test")
        client.data()
        client.receive_data(b"250 OK\r\n250 OK\r\n")
        client.next_reply()
        client.next_reply()
    client.receive_data(wire)
    with pytest.raises(ProtocolError, match="does not fit"):
        client.next_reply()


def test_starttls_resets_the_session_and_drops_injected_plaintext() -> None:
    client = ready_client("STARTTLS", "PIPELINING")
    assert client.starttls() == b"STARTTLS\r\n"
    with pytest.raises(RuntimeError):
        client.mail_from(SENDER)  # nothing may follow STARTTLS before its reply
    client.receive_data(b"220 2.0.0 go ahead\r\n250 2.1.5 injected\r\n")
    assert client.next_reply() == SmtpReply.of(220, "2.0.0 go ahead")
    assert state_of(client) is ClientState.CONNECTED and not client.extensions
    assert client.next_reply() is NEED_DATA  # the injected reply is gone
    with pytest.raises(RuntimeError):
        client.mail_from(SENDER)  # EHLO must come again first
    assert client.ehlo(HELO) == b"EHLO client.postroom.test\r\n"


def test_421_closes_the_session_at_any_point() -> None:
    client = ready_client()
    client.mail_from(SENDER)
    client.receive_data(S421_SHUTTING_DOWN.to_bytes())
    assert client.next_reply() == S421_SHUTTING_DOWN
    assert state_of(client) is ClientState.CLOSED
    with pytest.raises(RuntimeError):
        client.quit()


# -- the session against the sink --------------------------------------------------------


def verbs(sink: SmtpSink) -> list[str]:
    return [line.split(" ")[0].upper() for line in sink.transcript]


async def test_delivers_over_starttls(smtp_sink: SmtpSink, tls_ca: TlsAuthority) -> None:
    session = await connect(
        smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=tls_ca.client_context()
    )
    async with session:
        assert session.tls_active
        assert "STARTTLS" not in session.extensions and "PIPELINING" in session.extensions
        result = await session.send(SENDER, ["b@rcpt.test"], b"Subject: hi\n\n.dot\n.\nend")
        await session.quit()
    assert result.outcome_for("b@rcpt.test").is_success
    [message] = smtp_sink.messages
    assert message.tls and message.mail_from == SENDER and message.rcpt_to == ("b@rcpt.test",)
    assert message.data == b"Subject: hi\r\n\r\n.dot\r\n.\r\nend\r\n"
    assert verbs(smtp_sink) == ["EHLO", "STARTTLS", "EHLO", "MAIL", "RCPT", "DATA", "QUIT"]


async def test_delivers_in_plaintext_without_a_tls_context(smtp_sink: SmtpSink) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        assert not session.tls_active
        result = await session.send(SENDER, ["b@rcpt.test"], MESSAGE)
    assert result.data_reply is not None and result.data_reply.code == 250
    assert not smtp_sink.messages[0].tls
    assert "STARTTLS" not in verbs(smtp_sink)


async def test_failed_tls_handshake_is_a_transient_tls_failure(smtp_sink: SmtpSink) -> None:
    untrusting = ssl.create_default_context(cadata=trustme.CA().cert_pem.bytes().decode())
    with pytest.raises(TlsFailure, match="TLS handshake") as failure:
        await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=untrusting)
    assert isinstance(failure.value, TransientFailure)  # callers may retry in plain text
    assert failure.value.reply is None
    assert isinstance(failure.value.__cause__, trio.BrokenResourceError)


async def test_pipelining_sends_data_before_recipient_replies_are_known(
    smtp_sink: SmtpSink,
) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, ["tempfail@rcpt.test", "permfail@rcpt.test"], MESSAGE)
    # DATA went out with MAIL and RCPT, so it was sent although both RCPTs were refused.
    assert verbs(smtp_sink) == ["EHLO", "MAIL", "RCPT", "RCPT", "DATA", "RSET"]
    assert result.data_reply is None and not smtp_sink.messages
    assert result.outcome_for("tempfail@rcpt.test").is_transient
    assert result.outcome_for("permfail@rcpt.test").enhanced_status == "5.1.1"


async def test_no_data_when_every_recipient_is_refused(smtp_sink: SmtpSink) -> None:
    session = await connect(
        smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None, pipelining=False
    )
    async with session:
        result = await session.send(SENDER, ["tempfail@rcpt.test", "permfail@rcpt.test"], MESSAGE)
        again = await session.send(SENDER, ["b@rcpt.test"], MESSAGE)
    assert verbs(smtp_sink) == ["EHLO", "MAIL", "RCPT", "RCPT", "RSET", "MAIL", "RCPT", "DATA"]
    assert result.data_reply is None
    assert [result.outcome_for(r).code for r in result.recipient_replies] == [450, 550]
    assert again.outcome_for("b@rcpt.test").is_success and len(smtp_sink.messages) == 1


async def test_two_messages_share_one_connection(smtp_sink: SmtpSink, tls_ca: TlsAuthority) -> None:
    session = await connect(
        smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=tls_ca.client_context()
    )
    async with session:
        first = await session.send(SENDER, ["a@rcpt.test"], b"Subject: 1\r\n\r\none\r\n")
        assert session.usable  # ready for the next transaction
        second = await session.send(SENDER, ["b@rcpt.test"], b"Subject: 2\r\n\r\ntwo\r\n")
        await session.quit()
        assert not session.usable
    assert first.outcome_for("a@rcpt.test").is_success
    assert second.outcome_for("b@rcpt.test").is_success
    assert smtp_sink.connections == 1
    assert [m.rcpt_to for m in smtp_sink.messages] == [("a@rcpt.test",), ("b@rcpt.test",)]
    assert "RSET" not in verbs(smtp_sink)  # both ended normally


async def test_each_recipient_gets_its_own_outcome(smtp_sink: SmtpSink) -> None:
    recipients = ["ok@rcpt.test", "tempfail@rcpt.test", "permfail@rcpt.test"]
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, recipients, MESSAGE)
    assert [result.outcome_for(r).code for r in recipients] == [250, 450, 550]
    assert result.outcome_for("ok@rcpt.test") == result.data_reply
    assert list(result.recipient_replies) == recipients
    assert smtp_sink.messages[0].rcpt_to == ("ok@rcpt.test",)


async def test_refused_data_applies_to_every_accepted_recipient(smtp_sink: SmtpSink) -> None:
    smtp_sink.data_reply(554, "5.6.0 content rejected")
    recipients = ["a@rcpt.test", "b@rcpt.test", "permfail@rcpt.test"]
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, recipients, MESSAGE)
        after = await session.send(SENDER, ["a@rcpt.test"], MESSAGE)
    rejected = SmtpReply.of(554, "5.6.0 content rejected")
    assert [result.outcome_for(r) for r in recipients][:2] == [rejected, rejected]
    assert result.outcome_for("permfail@rcpt.test").code == 550
    assert after.outcome_for("a@rcpt.test").is_success
    assert "RSET" not in verbs(smtp_sink)  # the final dot ends a transaction either way


async def test_too_big_message_refused_at_mail_fails_every_recipient(nursery: trio.Nursery) -> None:
    sink = SmtpSink(max_message_size=100)
    await nursery.start(sink.run)
    async with await connect(sink.host, sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, ["a@rcpt.test", "b@rcpt.test"], b"x" * 200)
        small = await session.send(SENDER, ["a@rcpt.test"], b"small")
    assert result.mail_reply.code == 552 and result.recipient_replies == {}
    assert result.outcome_for("b@rcpt.test") == result.mail_reply
    assert sink.transcript[1] == f"MAIL FROM:<{SENDER}> SIZE=200"
    assert verbs(sink)[1:] == ["MAIL", "RCPT", "RCPT", "DATA", "RSET", "MAIL", "RCPT", "DATA"]
    assert small.outcome_for("a@rcpt.test").is_success


async def test_eight_bit_message_is_declared(smtp_sink: SmtpSink) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        await session.send(SENDER, ["b@rcpt.test"], "Subject: cafe\n\n\u00e9t\u00e9\n".encode())
    mail = next(line for line in smtp_sink.transcript if line.startswith("MAIL"))
    assert mail.endswith(" BODY=8BITMIME") and " SIZE=" in mail
    assert smtp_sink.messages[0].data == "Subject: cafe\r\n\r\n\u00e9t\u00e9\r\n".encode()


UTF8_HEADER = "From: a@b.test\r\nSubject: caf\u00e9\r\n\r\nbody\r\n".encode()


async def test_utf8_header_is_never_sent_raw_to_a_server_without_smtputf8(
    smtp_sink: SmtpSink,
) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, ["b@rcpt.test"], UTF8_HEADER)
        assert session.usable
    assert result.outcome_for("b@rcpt.test") == S554_MESSAGE_NEEDS_SMTPUTF8
    assert result.mail_reply.enhanced_status == "5.6.7"
    assert not any(line.startswith("MAIL") for line in smtp_sink.transcript)


async def test_utf8_header_and_address_go_in_an_smtputf8_transaction(
    nursery: trio.Nursery,
) -> None:
    sink = SmtpSink(smtputf8=True)
    await nursery.start(sink.run)
    async with await connect(sink.host, sink.port, helo_name=HELO, tls=None) as session:
        await session.send(SENDER, ["b@rcpt.test"], UTF8_HEADER)
        await session.send(SENDER, ["jos\u00e9@rcpt.test"], MESSAGE)
        probed = await session.probe(SENDER, "jos\u00e9@rcpt.test")
    mails = [line for line in sink.transcript if line.startswith("MAIL")]
    assert len(mails) == 3 and all(line.endswith(" SMTPUTF8") for line in mails)
    assert [m.data for m in sink.messages] == [UTF8_HEADER, MESSAGE]
    assert sink.messages[1].rcpt_to == ("jos\u00e9@rcpt.test",)
    assert probed.is_success


async def test_probe_of_a_non_ascii_address_without_smtputf8_is_answered_locally(
    smtp_sink: SmtpSink,
) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        reply = await session.probe(SENDER, "jos\u00e9@rcpt.test")
    assert reply == S553_NEEDS_SMTPUTF8
    assert not any(line.startswith("MAIL") for line in smtp_sink.transcript)


async def test_non_ascii_recipient_is_refused_locally_without_smtputf8(
    smtp_sink: SmtpSink,
) -> None:
    recipients = ["jos\u00e9@rcpt.test", "b@rcpt.test"]
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        result = await session.send(SENDER, recipients, MESSAGE)
    assert result.outcome_for("jos\u00e9@rcpt.test") == S553_NEEDS_SMTPUTF8
    assert result.outcome_for("b@rcpt.test").is_success
    assert smtp_sink.messages[0].rcpt_to == ("b@rcpt.test",)


async def test_unsendable_address_is_refused_before_anything_is_sent(
    smtp_sink: SmtpSink,
) -> None:
    async with await connect(smtp_sink.host, smtp_sink.port, helo_name=HELO, tls=None) as session:
        with pytest.raises(ValueError):
            await session.send(SENDER, ["b@rcpt.test", "c@rcpt.test>\r\nRSET"], MESSAGE)
        result = await session.send(SENDER, ["b@rcpt.test"], MESSAGE)
    assert result.outcome_for("b@rcpt.test").is_success
    assert verbs(smtp_sink) == ["EHLO", "MAIL", "RCPT", "DATA"]


# -- the session against servers the sink cannot imitate ---------------------------------


async def start_scripted_server(
    nursery: trio.Nursery, greeting: bytes | None, answers: dict[bytes, bytes] | None = None
) -> int:
    """A server on 127.0.0.1 that greets (or stays silent) and answers each command by verb."""

    async def handle(stream: trio.SocketStream) -> None:
        with contextlib.suppress(trio.BrokenResourceError):
            async with stream:
                if greeting is not None:
                    await stream.send_all(greeting)
                buffer = b""
                while data := await stream.receive_some(4096):
                    buffer += data
                    while b"\r\n" in buffer:
                        line, buffer = buffer.split(b"\r\n", 1)
                        verb = line.split(b" ")[0].upper()
                        answer = (answers or {}).get(verb, b"502 5.5.1 not here\r\n")
                        if answer:  # b"": stay silent
                            await stream.send_all(answer)

    listeners = await nursery.start(partial(trio.serve_tcp, handle, 0, host="127.0.0.1"))
    port: int = listeners[0].socket.getsockname()[1]
    return port


async def test_closed_port_is_transient() -> None:
    with trio.socket.socket() as sock:
        await sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # nothing listens here once the socket is closed
    with pytest.raises(TransientFailure, match="connecting") as failure:
        await connect("127.0.0.1", port, helo_name=HELO, tls=None)
    assert failure.value.reply is None and isinstance(failure.value.__cause__, OSError)


@pytest.mark.parametrize(
    ("greeting", "error"),
    [
        (b"554 5.3.2 no SMTP service here\r\n", PermanentFailure),
        (b"421-4.3.2 busy\r\n421 4.3.2 come back later\r\n", TransientFailure),
        (b"451 4.3.0 not now\r\n", TransientFailure),
    ],
)
async def test_refused_greeting_fails_the_connection(
    nursery: trio.Nursery, greeting: bytes, error: type[SmtpError]
) -> None:
    port = await start_scripted_server(nursery, greeting)
    with pytest.raises(error) as failure:
        await connect("127.0.0.1", port, helo_name=HELO, tls=None)
    reply = failure.value.reply
    assert isinstance(reply, SmtpReply) and reply.code == int(greeting[:3])


async def test_ehlo_refused_falls_back_to_helo(nursery: trio.Nursery) -> None:
    answers = {b"HELO": b"250 old.test\r\n", b"MAIL": b"250 OK\r\n", b"RCPT": b"250 OK\r\n"}
    answers |= {b"DATA": b"354 go\r\n", b".": b"250 queued\r\n", b"QUIT": b"221 bye\r\n"}
    port = await start_scripted_server(nursery, b"220 old.test\r\n", answers)
    session = await connect("127.0.0.1", port, helo_name=HELO, tls=None)
    async with session:
        assert not session.extensions
        with trio.fail_after(5):
            # Empty, so the scripted server sees no message lines, only the final ".".
            result = await session.send(SENDER, ["b@rcpt.test"], b"")
        assert result.outcome_for("b@rcpt.test") == SmtpReply.of(250, "queued")
        await session.quit()


async def test_421_mid_transaction_is_transient_and_retires_the_session(
    nursery: trio.Nursery,
) -> None:
    answers = {b"EHLO": b"250 mx.test\r\n", b"MAIL": S421_SHUTTING_DOWN.to_bytes()}
    port = await start_scripted_server(nursery, b"220 mx.test\r\n", answers)
    async with await connect("127.0.0.1", port, helo_name=HELO, tls=None) as session:
        with pytest.raises(TransientFailure) as failure:
            await session.send(SENDER, ["b@rcpt.test"], MESSAGE)
        assert failure.value.reply == S421_SHUTTING_DOWN
        assert not session.usable
        with pytest.raises(TransientFailure, match="no longer usable"):
            await session.send(SENDER, ["b@rcpt.test"], MESSAGE)
        await session.quit()  # nothing to say to a server that left; just close


async def test_silent_server_times_out(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    port = await start_scripted_server(nursery, greeting=None)
    start = trio.current_time()
    with pytest.raises(TransientFailure, match="timed out") as failure:
        await connect("127.0.0.1", port, helo_name=HELO, tls=None, timeout=30)
    assert isinstance(failure.value.__cause__, trio.TooSlowError)
    assert trio.current_time() - start == pytest.approx(30)


async def test_slow_final_reply_gets_the_data_timeout(
    nursery: trio.Nursery, autojump_clock: trio.testing.MockClock
) -> None:
    answers = {b"EHLO": b"250 mx.test\r\n", b"MAIL": b"250 OK\r\n", b"RCPT": b"250 OK\r\n"}
    answers |= {b"DATA": b"354 go\r\n", b".": b""}  # and silence after the message
    port = await start_scripted_server(nursery, b"220 mx.test\r\n", answers)
    async with await connect("127.0.0.1", port, helo_name=HELO, tls=None) as session:
        start = trio.current_time()
        with pytest.raises(TransientFailure, match="timed out"):
            await session.send(SENDER, ["b@rcpt.test"], b"")
        assert trio.current_time() - start == pytest.approx(120)
