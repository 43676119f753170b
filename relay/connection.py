"""The per-connection driver of the SMTP server machine: moves bytes, keeps time, does TLS.

Every decision about the protocol is `engine.smtp.server.SmtpServer`'s; every decision
about mail is the listener's `SessionHandler`'s. This loop only reads, writes, waits and
wraps the stream in TLS when the machine asks for it. Rules:
- Each read has a deadline (a command `command`, a piece of message data `data`, RFC 5321
  4.5.3.2), and the whole conversation `session`, so a slow or silent client cannot hold a
  connection for ever; a session that has neither authenticated nor opened a transaction is
  idle and gets far less (`idle`, or `idle_under_stress` while the listener is more than
  half full, as Postfix's smtpd_timeout does under stress).
- Message data never piles up in memory: past `SPOOL_AT` it goes to the session's spool
  (relay/spool.py); reading it takes `READING` from the process's budget of message bytes
  (engine/platform/message_memory.py), and the whole message is read back only when the budget has
  room for working on it: a session waits, and after `MEMORY_WAIT` is told 452 4.3.1. A
  message whose structure breaks a bound (engine/mail/structure.py) is refused with 554
  5.6.0 before any handler parses it. A header with 8-bit octets must be UTF-8, and outside
  an SMTPUTF8 transaction is encoded (RFC 2047) before a handler sees it, or refused with
  554 5.6.7 where it cannot be (engine/mail/international.py): never kept raw.
- Foreign errors (a broken socket, a failed handshake) end the connection quietly; an
  unexpected error in a handler is logged and answered 451, never allowed to take the
  listener down. A database that cannot be reached is 451 4.3.0 too, at once while storage
  knows it is gone, and no traceback: the client keeps the message.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import trio

from engine.mail import international, structure
from engine.platform.errors import StorageFull
from engine.platform.message_memory import MessageMemory
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
from relay.spool import SPOOL_AT, Spool
from storage.errors import DatabaseUnreachable, is_outage

log = logging.getLogger("postroom.relay")
_RECEIVE_SIZE = 65536
# What a session receiving message data holds of the budget: what it keeps before spooling,
# the octets of one read, and the machine's working copies of them.
READING = SPOOL_AT + 3 * _RECEIVE_SIZE
# How long a whole message waits for room in the budget before the client is told 452 and
# keeps it (its timeout for this reply is 10 minutes, RFC 5321 4.5.3.2.6).
MEMORY_WAIT = 120.0
S421_NO_MEMORY = SmtpReply.of(421, "4.3.1 Insufficient system resources, closing channel")


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Seconds each wait may last (docs/decisions.md says why these)."""

    command: float = 300.0  # RFC 5321 4.5.3.2.7, once the client is doing work
    data: float = 180.0
    tls_handshake: float = 30.0
    session: float = 3600.0
    idle: float = 30.0  # before AUTH or MAIL: a real client sends its next command at once
    idle_under_stress: float = 10.0  # Postfix's smtpd_timeout under stress


def _never_stressed() -> bool:
    return False


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
    stressed: Callable[[], bool] = _never_stressed,
    memory: MessageMemory | None = None,
) -> None:
    """Run one SMTP conversation to its end; closes nothing (the caller owns the stream).
    `stressed` says whether the listener is under stress now (shorter idle time); `memory`
    is the process's budget of message bytes (engine/platform/message_memory.py)."""
    incoming = _Incoming(memory or MessageMemory())
    try:
        await _converse(stream, server, handler, tls, timeouts, shutdown, tally, stressed, incoming)
    finally:
        incoming.done()


async def _converse(
    stream: trio.abc.Stream,
    server: SmtpServer,
    handler: SessionHandler,
    tls: ssl.SSLContext | None,
    timeouts: Timeouts,
    shutdown: ShutdownSignal,
    tally: Tally,
    stressed: Callable[[], bool],
    incoming: _Incoming,
) -> None:
    with trio.move_on_after(timeouts.session) as whole:
        while True:
            event = server.next_event()
            if event is NEED_DATA:
                await _flush(stream, server)
                if server.state is ServerState.DATA and not await incoming.make_room(
                    server, timeouts.data
                ):
                    server.close_with(S421_NO_MEMORY)
                    continue
                data = await _receive(stream, server, _wait(server, timeouts, stressed), shutdown)
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
                incoming.done()
                tally.message_done(accepted=False)
            elif isinstance(event, MessageData):
                reply = await _message(handler, event, incoming)
                tally.message_done(accepted=reply.is_success)
                server.respond(reply)
            else:
                server.respond(await _decide(handler, event))
    if whole.cancelled_caught:
        server.close_with(S421_TIMEOUT)
        await _flush(stream, server)


class _Incoming:
    """The message a session is receiving: its spool, and what it holds of the budget."""

    def __init__(self, memory: MessageMemory) -> None:
        self._memory = memory
        self._spool = Spool()
        self._reading = 0  # the budget held while message data is read
        self._working = 0  # the budget held while the whole message is worked on

    async def make_room(self, server: SmtpServer, seconds: float) -> bool:
        """Before message data is read: spool what the machine holds past SPOOL_AT, and
        hold this session's share of the budget for reading (waiting at most `seconds`);
        whether it is held."""
        if server.message_bytes_held >= SPOOL_AT:
            await self._spool.write(server.take_message_data())
        if not self._reading:
            with trio.move_on_after(seconds):
                await self._memory.acquire(READING)
                self._reading = READING
        return bool(self._reading)

    async def whole(self, event: MessageData, seconds: float) -> MessageData | None:
        """The event with the whole message, once the budget has room for working on it
        (waiting at most `seconds`); None if it had none."""
        self._memory.release(self._reading)
        self._reading = 0
        cost = self._memory.cost(self._spool.size + len(event.data))
        with trio.move_on_after(seconds):
            await self._memory.acquire(cost)
            self._working = cost
        if not self._working:
            return None
        return replace(event, data=await self._spool.read_with(event.data))

    def done(self) -> None:
        """The message is answered (or the session ended): give everything back."""
        self._memory.release(self._reading + self._working)
        self._reading = self._working = 0
        self._spool.discard()


async def _message(handler: SessionHandler, event: MessageData, incoming: _Incoming) -> SmtpReply:
    """The reply to a whole message: 452 when memory stays short, 554 5.6.0 when its
    structure breaks a bound (engine/mail/structure.py), 554 5.6.7 when its header is
    not UTF-8 or needs SMTPUTF8 the client did not ask for, else the handler's."""
    try:
        whole = await incoming.whole(event, MEMORY_WAIT)
        if whole is None:
            return S452_STORAGE_FULL
        problem = structure.problem(whole.data)
        if problem is not None:
            return SmtpReply.of(554, f"5.6.0 Message refused: {problem}")
        try:
            data = international.as_received(whole.data, whole.smtputf8)
        except international.CannotDowngrade as refused:
            return SmtpReply.of(554, f"5.6.7 Message refused: {refused.reason}")
        return await _decide(handler, replace(whole, data=data))
    finally:
        incoming.done()


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


def _wait(server: SmtpServer, timeouts: Timeouts, stressed: Callable[[], bool]) -> float:
    """How long the client may take to send its next bytes."""
    if server.state is ServerState.DATA:
        return timeouts.data
    if server.authenticated_as is not None or server.state in _IN_TRANSACTION:
        return timeouts.command
    return timeouts.idle_under_stress if stressed() else timeouts.idle


_IN_TRANSACTION = (ServerState.MAIL, ServerState.RCPT)


async def _receive(
    stream: trio.abc.Stream,
    server: SmtpServer,
    seconds: float,
    shutdown: ShutdownSignal,
) -> bytes | None:
    """The next bytes from the client, waiting at most `seconds`; None when the server hung
    up instead (421)."""
    in_data = server.state is ServerState.DATA
    # Between commands a shutdown may interrupt the wait; in the middle of a message it
    # may not (the client gets its answer first).
    idle = trio.CancelScope() if in_data else shutdown.idle_scope()
    try:
        with idle, trio.move_on_after(seconds) as wait:
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
