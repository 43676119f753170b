"""The per-connection driver of the SMTP server machine: moves bytes, keeps time, does TLS.

Every decision about the protocol is `engine.smtp.server.SmtpServer`'s; every decision
about mail is the listener's `SessionHandler`'s. This loop only reads, writes, waits and
wraps the stream in TLS when the machine asks for it. Rules: each read has a deadline (a
command `command_timeout`, a piece of message data `data_timeout`, RFC 5321 4.5.3.2), and
the whole conversation `session_timeout`, so a slow or silent client cannot hold a
connection for ever; foreign errors (a broken socket, a failed handshake) end the
connection quietly; an unexpected error in a handler is logged and answered 451, never
allowed to take the listener down. A database that cannot be reached is 451 4.3.0 too, at
once while storage knows it is gone, and no traceback: the client keeps the message.
"""

from __future__ import annotations

import logging
import ssl
from dataclasses import dataclass
from typing import Protocol

import trio

from engine.errors import StorageFull
from engine.smtp.replies import (
    S421_SHUTTING_DOWN,
    S421_TIMEOUT,
    S451_DATABASE_UNAVAILABLE,
    S451_LOCAL_ERROR,
    S452_STORAGE_FULL,
    SmtpReply,
)
from engine.smtp.server import (
    NEED_DATA,
    AuthAttempt,
    Closed,
    MailFrom,
    MessageData,
    MessageRefused,
    Quit,
    RcptTo,
    ServerState,
    SmtpServer,
    StartTlsRequested,
)
from storage.errors import DatabaseUnreachable, is_outage

log = logging.getLogger("postroom.relay")
_RECEIVE_SIZE = 65536


@dataclass(frozen=True, slots=True)
class Timeouts:
    command: float = 300.0
    data: float = 180.0
    tls_handshake: float = 30.0
    session: float = 3600.0


class SessionHandler(Protocol):
    """What a listener decides for one connection (a new handler per connection)."""

    async def authenticate(self, event: AuthAttempt) -> SmtpReply: ...

    async def mail_from(self, event: MailFrom) -> SmtpReply: ...

    async def rcpt_to(self, event: RcptTo) -> SmtpReply: ...

    async def message(self, event: MessageData) -> SmtpReply: ...


class Tally(Protocol):
    """Where a connection counts its messages (the listener's statistics)."""

    def message_done(self, accepted: bool) -> None: ...


class ShutdownSignal:
    """Shared by a listener's connections: set once, it makes every idle one say 421."""

    def __init__(self) -> None:
        self.closing = False
        self._idle: set[trio.CancelScope] = set()

    def close(self) -> None:
        self.closing = True
        for scope in self._idle:
            scope.cancel()

    def idle_scope(self) -> trio.CancelScope:
        scope = trio.CancelScope()
        if self.closing:
            scope.cancel()
        self._idle.add(scope)
        return scope

    def done(self, scope: trio.CancelScope) -> None:
        self._idle.discard(scope)


async def drive(
    stream: trio.abc.Stream,
    server: SmtpServer,
    handler: SessionHandler,
    *,
    tls: ssl.SSLContext | None,
    timeouts: Timeouts,
    shutdown: ShutdownSignal,
    tally: Tally,
) -> None:
    """Run one SMTP conversation to its end; closes nothing (the caller owns the stream)."""
    with trio.move_on_after(timeouts.session) as whole:
        while True:
            event = server.next_event()
            if event is NEED_DATA:
                await _flush(stream, server)
                data = await _receive(stream, server, timeouts, shutdown)
                if data is not None:
                    server.receive_data(data)
            elif isinstance(event, Quit | Closed):
                await _flush(stream, server)
                return
            elif isinstance(event, StartTlsRequested):
                await _flush(stream, server)
                if tls is None:  # the machine offers STARTTLS only when the listener has TLS
                    raise RuntimeError("STARTTLS requested without a TLS context")
                stream = trio.SSLStream(stream, tls, server_side=True)
                with trio.fail_after(timeouts.tls_handshake):
                    await stream.do_handshake()
                server.tls_started()
            elif isinstance(event, MessageRefused):
                tally.message_done(accepted=False)
            else:
                reply = await _decide(handler, event)
                if isinstance(event, MessageData):
                    tally.message_done(accepted=reply.is_success)
                server.respond(reply)
    if whole.cancelled_caught:
        server.close_with(S421_TIMEOUT)
        await _flush(stream, server)


async def _decide(
    handler: SessionHandler, event: AuthAttempt | MailFrom | RcptTo | MessageData
) -> SmtpReply:
    try:
        if isinstance(event, AuthAttempt):
            return await handler.authenticate(event)
        if isinstance(event, MailFrom):
            return await handler.mail_from(event)
        if isinstance(event, RcptTo):
            return await handler.rcpt_to(event)
        return await handler.message(event)
    except StorageFull:  # nothing was stored; the client keeps the message and retries
        return S452_STORAGE_FULL
    except Exception as exc:
        if is_outage(exc):
            if not isinstance(exc, DatabaseUnreachable):  # storage logs that one once
                log.error("SMTP %s: database unavailable: %s", type(event).__name__, exc)
            return S451_DATABASE_UNAVAILABLE
        log.exception("SMTP handler failed on %s", type(event).__name__)
        return S451_LOCAL_ERROR


async def _receive(
    stream: trio.abc.Stream,
    server: SmtpServer,
    timeouts: Timeouts,
    shutdown: ShutdownSignal,
) -> bytes | None:
    """The next bytes from the client; None when the server hung up instead (421)."""
    in_data = server.state is ServerState.DATA
    # Between commands a shutdown may interrupt the wait; in the middle of a message it
    # may not (the client gets its answer first).
    idle = trio.CancelScope() if in_data else shutdown.idle_scope()
    try:
        with idle, trio.move_on_after(timeouts.data if in_data else timeouts.command) as wait:
            return bytes(await stream.receive_some(_RECEIVE_SIZE))
    finally:
        shutdown.done(idle)
    if wait.cancelled_caught:
        server.close_with(S421_TIMEOUT)
    else:
        server.close_with(S421_SHUTTING_DOWN)
    return None


async def _flush(stream: trio.abc.Stream, server: SmtpServer) -> None:
    data = server.data_to_send()
    if data:
        await stream.send_all(data)
