"""The sans-I/O SMTP server machine driven in memory: bytes fed, every request answered by a
decision, the replies read back as codes, and a server already past EHLO, STARTTLS and AUTH."""

from __future__ import annotations

import base64
from collections.abc import Callable

from engine.smtp.replies import S235_AUTH_OK, S250_QUEUED, SmtpReply
from engine.smtp.server import (
    NEED_DATA,
    AuthAttempt,
    Closed,
    Event,
    MailFrom,
    MessageData,
    Quit,
    RcptTo,
    ServerPolicy,
    SmtpServer,
)

POLICY = ServerPolicy("relay.test", max_message_size=10_000, tls_available=True, auth=True)


def accept(event: Event) -> SmtpReply:
    if isinstance(event, AuthAttempt):
        return S235_AUTH_OK
    if isinstance(event, MessageData):
        return S250_QUEUED
    return SmtpReply.of(250, "2.0.0 OK")


def run(
    server: SmtpServer, data: bytes, decide: Callable[[Event], SmtpReply] = accept
) -> tuple[list[Event], bytes]:
    """Feed `data`, answer every request with `decide`; the events and the replies sent.
    Nothing to feed is not the end of the input (`close` is)."""
    if data:
        server.receive_data(data)
    events: list[Event] = []
    while True:
        event = server.next_event()
        if event is NEED_DATA:
            break
        events.append(event)
        if isinstance(event, AuthAttempt | MailFrom | RcptTo | MessageData):
            server.respond(decide(event))
        if isinstance(event, Closed | Quit):
            break
    return events, server.data_to_send()


def codes(replies: bytes) -> list[str]:
    """Each reply's code and enhanced status, e.g. ["250 2.1.0", ...] (last lines only)."""
    found = []
    for line in replies.decode().split("\r\n"):
        if len(line) > 3 and line[3] == " ":
            found.append(" ".join(line.split(" ")[:2]))
    return found


def authenticated(policy: ServerPolicy = POLICY) -> SmtpServer:
    """A server after greeting, EHLO, STARTTLS (as if the handshake passed) and, when the
    policy has it, AUTH."""
    server = SmtpServer(policy)
    run(server, b"EHLO client.test\r\nSTARTTLS\r\n")
    server.tls_started()
    run(server, b"EHLO client.test\r\n")
    if policy.auth:
        token = base64.b64encode(b"\0user@example.org\0secret").decode()
        events, _ = run(server, f"AUTH PLAIN {token}\r\n".encode())
        assert events == [AuthAttempt("PLAIN", "user@example.org", "secret")]
    return server
