"""The SMTP server machine without sockets: fed bytes, checked on its events and replies.

Where it fits, the other side is our own client machine (engine/smtp/client.py), so both
halves of the grammar are held to each other.
"""

from __future__ import annotations

import base64

import pytest

from engine.smtp.client import ClientState, SmtpClient
from engine.smtp.replies import S550_RELAY_DENIED, SmtpReply
from engine.smtp.server import (
    MAX_ERRORS,
    NEED_DATA,
    AuthAttempt,
    Closed,
    Event,
    MailFrom,
    MessageData,
    MessageRefused,
    Quit,
    RcptTo,
    ServerPolicy,
    ServerState,
    SmtpServer,
    StartTlsRequested,
)
from tests.harness.smtp_machine import POLICY, accept, authenticated, codes, run

OPEN = ServerPolicy("mx.test", max_message_size=10_000, tls_available=True)


def test_client_and_server_machines_complete_a_pipelined_transaction() -> None:
    server = SmtpServer(OPEN)
    client = SmtpClient()

    def exchange(data: bytes) -> list[Event]:
        events, replies = run(server, data)
        if replies:
            client.receive_data(replies)
        while client.next_reply() is not NEED_DATA:
            pass
        return events

    exchange(b"")  # the greeting
    exchange(client.ehlo("client.test"))
    assert client.state is ClientState.READY
    assert {"PIPELINING", "8BITMIME", "ENHANCEDSTATUSCODES", "STARTTLS"} <= set(client.extensions)
    assert client.extensions["SIZE"] == "10000"
    assert "AUTH" not in client.extensions  # this listener has no AUTH at all

    message = b"Subject: hi\r\n\r\n.leading dot\r\n..two\r\nlast line without newline"
    events = exchange(
        client.mail_from("a@example.org", len(message))
        + client.rcpt_to("b@example.net")
        + client.rcpt_to("c@example.net")
        + client.data()
    )
    assert events == [
        MailFrom("a@example.org", len(message)),
        RcptTo("b@example.net"),
        RcptTo("c@example.net"),
    ]
    assert client.state in (ClientState.MESSAGE,)  # (mypy narrowed it to READY above)
    [data] = exchange(client.message(message))
    assert data == MessageData(
        "a@example.org",
        ("b@example.net", "c@example.net"),
        b"Subject: hi\r\n\r\n.leading dot\r\n..two\r\nlast line without newline\r\n",
        helo="client.test",
        protocol="ESMTP",  # EHLO without TLS or AUTH (RFC 3848)
    )
    assert exchange(client.quit()) == [Quit()]


def test_data_split_into_single_octets_is_framed_the_same() -> None:
    server = authenticated(OPEN)
    run(server, b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    stream = b"..dot\r\nline\r\n\r\n.\r\nQUIT\r\n"
    events: list[Event] = []
    for octet in stream:
        events += run(server, bytes([octet]))[0]
    assert events == [
        MessageData(
            "a@example.org",
            ("b@example.net",),
            b".dot\r\nline\r\n\r\n",
            helo="client.test",
            protocol="ESMTPS",
        ),
        Quit(),
    ]


def test_auth_is_neither_offered_nor_accepted_before_tls() -> None:
    server = SmtpServer(POLICY)
    _, replies = run(server, b"EHLO client.test\r\n")
    assert b"AUTH" not in replies and b"STARTTLS" in replies
    token = base64.b64encode(b"\0user\0secret").decode()
    events, replies = run(server, f"AUTH PLAIN {token}\r\nMAIL FROM:<a@example.org>\r\n".encode())
    assert events == []
    assert codes(replies) == ["530 5.7.0", "530 5.7.0"]


def test_mail_needs_auth_on_submission() -> None:
    server = SmtpServer(POLICY)
    run(server, b"EHLO client.test\r\nSTARTTLS\r\n")
    server.tls_started()
    _, replies = run(server, b"EHLO client.test\r\nMAIL FROM:<a@example.org>\r\n")
    assert b"250-AUTH PLAIN LOGIN" in replies or b"250 AUTH PLAIN LOGIN" in replies
    assert b"STARTTLS" not in replies
    assert codes(replies)[-1] == "530 5.7.0"


def test_auth_login_exchange_and_refusal() -> None:
    server = SmtpServer(POLICY)
    run(server, b"EHLO c\r\nSTARTTLS\r\n")
    server.tls_started()
    run(server, b"EHLO c\r\n")
    _, replies = run(server, b"AUTH LOGIN\r\n")
    assert replies == b"334 VXNlcm5hbWU6\r\n"
    _, replies = run(server, base64.b64encode(b"user@example.org") + b"\r\n")
    assert replies == b"334 UGFzc3dvcmQ6\r\n"
    events, replies = run(
        server,
        base64.b64encode(b"wrong") + b"\r\n",
        lambda e: SmtpReply.of(535, "5.7.8 Authentication credentials invalid"),
    )
    assert events == [AuthAttempt("LOGIN", "user@example.org", "wrong")]
    assert codes(replies) == ["535 5.7.8"]
    assert server.authenticated_as is None
    _, replies = run(server, b"AUTH LOGIN\r\n*\r\nAUTH PLAIN\r\n!!notbase64\r\nAUTH CRAM-MD5\r\n")
    assert codes(replies) == ["334 VXNlcm5hbWU6", "501 5.7.0", "334 ", "501 5.5.2", "504 5.5.4"]


def test_commands_pipelined_after_starttls_are_discarded() -> None:
    server = SmtpServer(POLICY)
    run(server, b"EHLO client.test\r\n")
    events, replies = run(server, b"STARTTLS\r\nRSET\r\nMAIL FROM:<evil@example.org>\r\n")
    assert events == [StartTlsRequested()]
    assert codes(replies) == ["220 2.0.0"]
    # Plaintext that arrives before the handshake is ignored as well.
    assert run(server, b"NOOP\r\n") == ([], b"")
    server.tls_started()
    assert server.state is ServerState.CONNECTED
    events, replies = run(server, b"")
    assert events == [] and replies == b""
    _, replies = run(server, b"MAIL FROM:<a@example.org>\r\n")
    assert codes(replies) == ["503 5.5.1"]  # EHLO again first


@pytest.mark.parametrize(
    "smuggled",
    [b"\n.\n", b"\r.\r\n", b"\n.\r\n", b"\r\n.\n", b"\r\n.\r"],
    ids=["lf-dot-lf", "cr-dot-crlf", "lf-dot-crlf", "crlf-dot-lf", "crlf-dot-cr"],
)
def test_smuggled_end_of_data_never_splits_a_message(smuggled: bytes) -> None:
    server = authenticated(OPEN)
    run(server, b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    smuggling = (
        b"Subject: one\r\n\r\nfirst"
        + smuggled
        + b"MAIL FROM:<admin@example.org>\r\nRCPT TO:<victim@example.net>\r\nDATA\r\n"
        + b"Subject: two\r\n\r\nsecond\r\n.\r\n"
    )
    events, replies = run(server, smuggling)
    assert [type(e) for e in events] == [MessageRefused]
    assert codes(replies) == ["554 5.6.0"]
    assert server.state is ServerState.READY


def test_bare_line_endings_in_commands_are_refused() -> None:
    server = SmtpServer(OPEN)
    events, replies = run(server, b"EHLO a\nEHLO b\rNOOP\r\nEHLO c\r\n")
    assert events == []
    assert codes(replies) == ["220 mx.test", "500 5.5.2", "500 5.5.2", "250 STARTTLS"]
    assert server.state is ServerState.READY


def test_line_limits() -> None:
    server = SmtpServer(OPEN)
    _, replies = run(server, b"NOOP " + b"x" * 600 + b"\r\nNOOP\r\n")
    assert codes(replies)[1:] == ["500 5.5.6", "250 2.0.0"]
    server = authenticated(OPEN)
    run(server, b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    line = b"y" * 998 + b"\r\n"  # exactly the limit
    events, replies = run(server, line + b".\r\n")
    assert [type(e) for e in events] == [MessageData]
    run(server, b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    events, replies = run(server, b"z" * 999 + b"\r\n.\r\n")
    assert [type(e) for e in events] == [MessageRefused]
    assert codes(replies) == ["554 5.6.0"]
    # A line with no end at all is refused at the end of the data, not buffered.
    run(server, b"MAIL FROM:<a@example.org>\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    events = []
    for _ in range(20):
        events += run(server, b"w" * 5000)[0]
    events += run(server, b"\r\n.\r\n")[0]
    assert [type(e) for e in events] == [MessageRefused]


def test_message_size_is_advertised_and_enforced() -> None:
    server = authenticated(OPEN)
    _, replies = run(server, b"MAIL FROM:<a@example.org> SIZE=10001\r\n")
    assert codes(replies) == ["552 5.3.4"]
    run(server, b"MAIL FROM:<a@example.org> SIZE=100\r\nRCPT TO:<b@example.net>\r\nDATA\r\n")
    events, replies = run(server, (b"x" * 98 + b"\r\n") * 150 + b".\r\n")
    assert events == [MessageRefused(SmtpReply.of(552, "5.3.4 Message size exceeds fixed limit"))]
    assert codes(replies)[-1] == "552 5.3.4"


def test_sequence_and_syntax_errors() -> None:
    server = SmtpServer(OPEN)
    _, replies = run(
        server, b"MAIL FROM:<a@example.org>\r\nEHLO c\r\nRCPT TO:<b@x.org>\r\nDATA\r\n"
    )
    assert codes(replies)[1] == "503 5.5.1"
    assert codes(replies)[3:] == ["503 5.5.1", "503 5.5.1"]
    _, replies = run(
        server,
        b"MAIL TO:<a@example.org>\r\nMAIL FROM:a@example.org\r\n"
        b"MAIL FROM:<a@example.org> FOO=1\r\nBDAT 10\r\nWHAT\r\n",
    )
    assert codes(replies) == ["501 5.5.4", "553 5.1.3", "555 5.5.4", "502 5.5.1", "500 5.5.2"]
    events, replies = run(
        server,
        b"MAIL FROM:<>\r\nDATA\r\nRCPT TO:<>\r\nRCPT TO:<b@example.net>\r\n",
        lambda e: S550_RELAY_DENIED if isinstance(e, RcptTo) else accept(e),
    )
    assert events == [MailFrom("", None), RcptTo("b@example.net")]
    assert codes(replies) == ["250 2.0.0", "554 5.5.1", "553 5.1.3", "550 5.7.1"]
    _, replies = run(server, b"RSET\r\nVRFY x\r\nNOOP\r\n")
    assert codes(replies) == ["250 2.0.0", "252 2.5.0", "250 2.0.0"]


def test_too_many_errors_end_the_connection() -> None:
    server = SmtpServer(OPEN)
    events, replies = run(server, b"WHAT\r\n" * (MAX_ERRORS + 5))
    assert events == [Closed()]
    assert codes(replies)[-1] == "421 4.7.0"
    assert codes(replies).count("500 5.5.2") == MAX_ERRORS


def test_client_closing_is_a_notice() -> None:
    server = SmtpServer(OPEN)
    run(server, b"EHLO c\r\n")
    server.receive_data(b"")
    assert run(server, b"") == ([Closed()], b"")


def test_smtputf8_is_offered_and_opens_an_internationalised_transaction() -> None:
    server = authenticated(OPEN)
    client = SmtpClient()
    client.receive_data(b"220 mx.test\r\n")
    client.next_reply()
    client.ehlo("client.test")
    client.receive_data(b"250-mx.test\r\n250 SMTPUTF8\r\n")
    client.next_reply()
    commands = (
        client.mail_from("jos\u00e9@example.org", smtputf8=True)
        + client.rcpt_to("\u00fcml\u00e4ut@example.net")
        + client.rcpt_to("b@example.net")
        + client.data()
    )
    events, _ = run(server, commands)
    assert events == [
        MailFrom("jos\u00e9@example.org", None, smtputf8=True),
        RcptTo("\u00fcml\u00e4ut@example.net"),
        RcptTo("b@example.net"),
    ]
    [message], _ = run(server, "Subject: caf\u00e9\r\n\r\nx\r\n.\r\n".encode())
    assert isinstance(message, MessageData) and message.smtputf8
    _, ehlo = run(SmtpServer(OPEN), b"EHLO client.test\r\n")
    assert b"250-SMTPUTF8\r\n" in ehlo


def test_a_u_label_domain_under_smtputf8_is_taken_as_its_a_labels() -> None:
    server = authenticated(OPEN)
    commands = (
        "EHLO client.test\r\n"
        "MAIL FROM:<jos\u00e9@b\u00fccher.example> SMTPUTF8\r\n"
        "RCPT TO:<b@M\u00dcNCHEN.example>\r\n"
        "RCPT TO:<c@a\u2024b.example>\r\n"  # ONE DOT LEADER: not a valid IDN
    ).encode()
    events, replies = run(server, commands)
    assert [e for e in events if isinstance(e, MailFrom | RcptTo)] == [
        MailFrom("jos\u00e9@xn--bcher-kva.example", None, smtputf8=True),
        RcptTo("b@xn--mnchen-3ya.example"),
    ]
    assert codes(replies)[-1] == "553 5.1.3"
    # Without SMTPUTF8 a U-label domain is refused as any non-ASCII path is.
    _, plain = run(authenticated(OPEN), "MAIL FROM:<a@b\u00fccher.example>\r\n".encode())
    assert codes(plain)[-1] == "553 5.6.7"


@pytest.mark.parametrize(
    "commands",
    [
        "MAIL FROM:<jos\u00e9@example.org>\r\n".encode(),
        "MAIL FROM:<a@example.org>\r\nRCPT TO:<jos\u00e9@example.net>\r\n".encode(),
    ],
)
def test_non_ascii_address_without_smtputf8_is_refused_with_5_6_7(commands: bytes) -> None:
    server = authenticated(OPEN)
    events, replies = run(server, commands)
    assert codes(replies)[-1] == "553 5.6.7"
    assert not any(isinstance(e, RcptTo) for e in events)


@pytest.mark.parametrize(
    "path",
    [
        b"MAIL FROM:<jos\xe9@example.org> SMTPUTF8\r\n",  # Latin-1, not UTF-8
        "MAIL FROM:<a\u0085b@example.org> SMTPUTF8\r\n".encode(),  # a C1 control (NEL)
        ("MAIL FROM:<" + "\u00e9" * 33 + "@example.org> SMTPUTF8\r\n").encode(),  # 66 octets
        b"MAIL FROM:<a@example.org> SMTPUTF8=yes\r\n",
    ],
)
def test_malformed_internationalised_paths_are_refused(path: bytes) -> None:
    server = authenticated(OPEN)
    events, replies = run(server, path)
    assert events == []
    assert codes(replies)[-1] in ("553 5.1.3", "555 5.5.4")
