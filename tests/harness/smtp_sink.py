"""An SMTP server on 127.0.0.1 that stands in for recipients' MX hosts in tests.

It accepts mail and records it (``messages``, ``transcript``, ``connections``), and answers
as the test tells it to:

* ``reply_for(address, code, text)``: a fixed RCPT reply for one address;
* local parts starting with ``tempfail`` get ``450 4.2.0``, ``permfail`` get ``550 5.1.1``;
* ``fail_first(address, n)``: the first ``n`` RCPTs for an address fail, later ones pass;
* ``data_reply(code, text, count)``: the reply after the next ``count`` DATA transfers.

It offers SMTPUTF8 (RFC 6531) only when made with ``smtputf8=True``, and is strict about it
as a conforming MX may be: the parameter where it is not offered is refused (555), and a
message whose header has 8-bit octets outside an SMTPUTF8 transaction is refused with
``554 5.6.7`` (nothing may pass a UTF-8 header to a hop that did not agree to take one).

Explicit ``reply_for`` wins over ``fail_first``, which wins over the local-part convention.
Addresses are matched case-insensitively. Timestamps use the Trio clock, so intervals
between deliveries are meaningful under a virtual (``MockClock``) clock too.
"""

from __future__ import annotations

import contextlib
import re
import ssl
from collections import defaultdict, deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial

import trio

from tests.harness.peer import HOST, Arrivals, LoopbackPeer

MAX_LINE = 4096  # bytes including CRLF; longer command or text lines get 500
DEFAULT_MAX_MESSAGE_SIZE = 10 * 1024 * 1024
_READ_CHUNK = 65536

# "FROM:<path> PARAMS" / "TO:<path> PARAMS"; some clients put a space after the colon.
_PATH_ARG = re.compile(r"^(FROM|TO):\s*<([^<>]*)>\s*(.*)$", re.IGNORECASE)


@dataclass(frozen=True)
class ReceivedMessage:
    """One accepted DATA transfer, with only the recipients that were accepted."""

    mail_from: str  # "" for the null reverse-path of bounces
    rcpt_to: tuple[str, ...]
    data: bytes  # dot-unstuffed, CRLF line endings, without the terminating "."
    tls: bool  # whether the session had been upgraded with STARTTLS
    received_at: float  # trio.current_time()
    smtputf8: bool = False  # whether MAIL FROM carried SMTPUTF8
    peer: str = ""  # the address the connection came from (which egress source sent it)
    helo: str = ""  # the name the client greeted with (EHLO or HELO)


@dataclass(frozen=True)
class SmtpReply:
    code: int
    text: str

    @property
    def accepted(self) -> bool:
        return 200 <= self.code < 300


@dataclass
class _Flaky:
    remaining: int
    reply: SmtpReply


OK = SmtpReply(250, "2.0.0 OK")
TEMPFAIL = SmtpReply(450, "4.2.0 try again later")
PERMFAIL = SmtpReply(550, "5.1.1 no such user")


class _LineTooLong(Exception):
    pass


class _LineReader:
    """CRLF line reader whose stream can be swapped (STARTTLS) dropping buffered bytes."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self._buffer = bytearray()

    def switch_to(self, stream: trio.abc.Stream) -> None:
        # Plaintext pipelined after STARTTLS must not be obeyed (the CVE-2011-0411 class
        # of command injection), so anything already buffered is thrown away.
        self.stream = stream
        self._buffer.clear()

    async def readline(self) -> bytes | None:
        """Next line without its line ending, or None at EOF.

        An over-long line is consumed through its end, then reported as _LineTooLong.
        """
        too_long = False
        while True:
            end = self._buffer.find(b"\n")
            if end >= 0:
                line = bytes(self._buffer[:end])
                del self._buffer[: end + 1]
                if too_long or end + 1 > MAX_LINE:
                    raise _LineTooLong
                return line.removesuffix(b"\r")
            if len(self._buffer) >= MAX_LINE:
                too_long = True  # keep memory bounded: drop the rest of this line
                self._buffer.clear()
            chunk = await self.stream.receive_some(_READ_CHUNK)
            if not chunk:
                return None
            self._buffer += chunk

    def take_lines(self) -> bytes:
        """Every complete line buffered now, line ends included (b"" if none): what a
        message's data is read by in bulk, since line by line took the sink seconds of CPU
        for a 34 MiB message."""
        end = self._buffer.rfind(b"\n") + 1
        lines = bytes(self._buffer[:end])
        del self._buffer[:end]
        return lines

    def put_back(self, lines: bytes) -> None:
        """Return lines taken but not used (pipelined after a message) to be read first."""
        self._buffer[:0] = lines


class SmtpSink(LoopbackPeer):
    """Scriptable SMTP peer; start it with ``await nursery.start(sink.run)``."""

    def __init__(
        self,
        ssl_context: ssl.SSLContext | None = None,
        *,
        hostname: str = "sink.test",
        max_message_size: int = DEFAULT_MAX_MESSAGE_SIZE,
        smtputf8: bool = False,
        requiretls: bool = False,
    ) -> None:
        self.ssl_context = ssl_context  # None: STARTTLS is neither advertised nor accepted
        self.smtputf8 = smtputf8  # SMTPUTF8 advertised and accepted
        self.requiretls = requiretls  # REQUIRETLS (RFC 8689) advertised and accepted over TLS
        self.hostname = hostname
        self.max_message_size = max_message_size
        self._arrivals: Arrivals[ReceivedMessage] = Arrivals()
        self.messages = self._arrivals.items
        self.transcript: list[str] = []  # every command line, all connections, in order
        self.connections = 0
        # Connections open now (until QUIT, or the end), and the most at one time.
        self.open_connections = 0
        self.most_open_connections = 0
        # Transactions (MAIL to the reply after DATA) under way now, and the most at one time:
        # what a sender's per-destination concurrency limit holds.
        self.open_transactions = 0
        self.most_open_transactions = 0
        # The same per domain of the envelope sender: what one sender's share of them is.
        self.open_by_sender: dict[str, int] = defaultdict(int)
        self.most_open_by_sender: dict[str, int] = defaultdict(int)
        # Transactions past DATA now (354 sent, the reply to the data not yet): those a
        # sender cut off now may have delivered without knowing it.
        self.past_data = 0
        self.mail_times: list[float] = []  # trio.current_time() of every MAIL FROM accepted
        self.data_delay = 0.0  # seconds a message waits for its reply (a slow receiver)
        self._rcpt_replies: dict[str, SmtpReply] = {}
        self._flaky: dict[str, _Flaky] = {}
        self._serving: dict[_Session, trio.CancelScope] = {}  # the connections open now
        self._data_replies: deque[SmtpReply] = deque()

    # -- scripting -------------------------------------------------------------------

    def reply_for(self, address: str, code: int, text: str) -> None:
        """Answer every RCPT TO for ``address`` with ``code text`` (2xx accepts)."""
        self._rcpt_replies[address.lower()] = SmtpReply(code, text)

    def fail_first(self, address: str, n: int, code: int = 451, text: str | None = None) -> None:
        """Refuse the first ``n`` RCPT attempts for ``address``, then treat it normally."""
        default_text = "4.3.0 temporary failure" if code < 500 else "5.0.0 rejected"
        self._flaky[address.lower()] = _Flaky(n, SmtpReply(code, text or default_text))

    def data_reply(self, code: int, text: str, count: int = 1) -> None:
        """Reply ``code text`` after the next ``count`` messages (2xx still records them)."""
        self._data_replies.extend([SmtpReply(code, text)] * count)

    def rcpt_reply(self, address: str) -> SmtpReply:
        """The reply the next RCPT TO for ``address`` gets (consumes ``fail_first`` budget)."""
        key = address.lower()
        if key in self._rcpt_replies:
            return self._rcpt_replies[key]
        flaky = self._flaky.get(key)
        if flaky is not None and flaky.remaining > 0:
            flaky.remaining -= 1
            return flaky.reply
        local_part = key.rpartition("@")[0]
        if local_part.startswith("tempfail"):
            return TEMPFAIL
        if local_part.startswith("permfail"):
            return PERMFAIL
        return SmtpReply(250, "2.1.5 OK")

    def next_data_reply(self) -> SmtpReply:
        """The reply for the DATA transfer now ending (consumes ``data_reply`` budget)."""
        return self._data_replies.popleft() if self._data_replies else OK

    def record(self, message: ReceivedMessage) -> None:
        """Store an accepted message and wake ``wait_for_messages``."""
        self._arrivals.add(message)

    async def wait_for_messages(
        self,
        n: int,
        timeout: float = 10,  # noqa: ASYNC109 - a built-in deadline keeps tests terse
    ) -> list[ReceivedMessage]:
        """Wait until at least ``n`` messages were accepted; return all received so far."""
        return await self._arrivals.wait_for(n, timeout)

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``nursery.start`` returns the bound port."""
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(partial(trio.serve_tcp, self._handle, 0, host=HOST))
            self._port = listeners[0].socket.getsockname()[1]
            task_status.started(self.port)

    async def also_on(
        self, host: str, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
    ) -> None:
        """Serve on another loopback address too (127.0.0.2, ::1...), at the same port: an
        MX host of its own whose mail lands here. Start it once `run` has bound the port."""
        listeners = await trio.open_tcp_listeners(self.port, host=host)
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        self.open_connections += 1
        self.most_open_connections = max(self.most_open_connections, self.open_connections)
        session = _Session(self, stream, stream.socket.getpeername()[0])
        # A client hanging up or rejecting our certificate is its business, not a crash of
        # the sink (serve_tcp would otherwise take the whole server down).
        with trio.CancelScope() as serving:
            self._serving[session] = serving
            try:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await session.run()
            finally:
                del self._serving[session]
                session.reset_transaction()
                session.leave()

    def hang_up(self) -> None:
        """Close every open connection without a word, as a server dropping idle clients:
        one between transactions at once, one in a transaction once it is answered."""
        for session, serving in self._serving.items():
            if session.mail_from is None:
                serving.cancel()
            else:
                session.hang_up_after = True


def _domain_of(address: str) -> str:
    return address.rpartition("@")[2].lower()


@dataclass
class _Content:
    """A message's data as it is read: kept, or only counted once it is refused."""

    max_size: int
    error: SmtpReply | None = None
    _size: int = 0
    _chunks: list[bytes] = field(default_factory=list)

    def refuse(self, reply: SmtpReply) -> None:
        self.error = self.error or reply  # the first reason stands

    def add_line(self, line: bytes) -> None:
        """One line, without its line end, as sent (dot-stuffed)."""
        self.add((line[1:] if line.startswith(b".") else line) + b"\r\n")  # RFC 5321 4.5.2

    def add(self, text: bytes) -> None:
        """Unstuffed lines, each ending in CRLF."""
        self._size += len(text)
        if self._size > self.max_size:
            self.refuse(SmtpReply(552, "5.3.4 message size exceeds fixed limit"))
        if self.error is None:
            self._chunks.append(text)

    def data(self) -> bytes:
        return b"".join(self._chunks)


class _Session:
    """One SMTP connection: the command loop and per-transaction state."""

    def __init__(self, sink: SmtpSink, stream: trio.abc.Stream, peer: str) -> None:
        self.sink = sink
        self.peer = peer
        self.greeting = ""
        self.reader = _LineReader(stream)
        self.tls = False
        self.greeted = False
        self.done = False
        self.left = False  # no longer counted in `SmtpSink.open_connections`
        self.hang_up_after = False  # close once the transaction under way is answered
        self.mail_from: str | None = None
        self.smtputf8 = False
        self.rcpt_to: list[str] = []
        self.commands: dict[str, Callable[[str], Awaitable[None]]] = {
            "EHLO": self.ehlo,
            "HELO": self.helo,
            "STARTTLS": self.starttls,
            "MAIL": self.mail,
            "RCPT": self.rcpt,
            "DATA": self.data,
            "RSET": self.rset,
            "NOOP": self.noop,
            "QUIT": self.quit,
        }

    async def reply(self, code: int, *lines: str) -> None:
        # Multi-line replies use "code-" on all but the last line (RFC 5321 4.2.1).
        rendered = [f"{code}-{line}" for line in lines[:-1]] + [f"{code} {lines[-1]}"]
        await self.reader.stream.send_all("".join(f"{r}\r\n" for r in rendered).encode())

    def reset_transaction(self) -> None:
        if self.mail_from is not None:
            self.sink.open_transactions -= 1
            self.sink.open_by_sender[_domain_of(self.mail_from)] -= 1
        self.mail_from = None
        self.smtputf8 = False
        self.rcpt_to = []

    async def run(self) -> None:
        await self.reply(220, f"{self.sink.hostname} ESMTP Postroom test sink")
        while not self.done:
            try:
                line = await self.reader.readline()
            except _LineTooLong:
                await self.reply(500, "5.5.2 line too long")
                continue
            if line is None:
                return
            command = line.decode("utf-8", "replace")
            self.sink.transcript.append(command)
            verb, _, argument = command.partition(" ")
            handler = self.commands.get(verb.upper())
            if handler is None:
                await self.reply(500, "5.5.2 command not recognized")
            else:
                await handler(argument.strip())
            if self.hang_up_after and self.mail_from is None:
                break
        with contextlib.suppress(trio.BrokenResourceError):
            await self.reader.stream.aclose()  # graceful, so TLS sends close_notify

    async def ehlo(self, argument: str) -> None:
        if not argument:
            await self.reply(501, "5.5.4 EHLO needs a domain")
            return
        self.greeted, self.greeting = True, argument
        self.reset_transaction()
        extensions = [
            "PIPELINING",
            "8BITMIME",
            "ENHANCEDSTATUSCODES",
            f"SIZE {self.sink.max_message_size}",
        ]
        if self.sink.smtputf8:
            extensions.append("SMTPUTF8")
        if self.sink.ssl_context is not None and not self.tls:
            extensions.append("STARTTLS")
        if self.sink.requiretls and self.tls:
            extensions.append("REQUIRETLS")
        await self.reply(250, f"{self.sink.hostname} greets {argument}", *extensions)

    async def helo(self, argument: str) -> None:
        if not argument:
            await self.reply(501, "5.5.4 HELO needs a domain")
            return
        self.greeted, self.greeting = True, argument
        self.reset_transaction()
        await self.reply(250, self.sink.hostname)

    async def starttls(self, argument: str) -> None:
        if self.sink.ssl_context is None:
            await self.reply(454, "4.7.0 TLS not available")
            return
        if self.tls:
            await self.reply(503, "5.5.1 TLS already active")
            return
        await self.reply(220, "2.0.0 ready to start TLS")
        tls_stream = trio.SSLStream(self.reader.stream, self.sink.ssl_context, server_side=True)
        await tls_stream.do_handshake()
        self.reader.switch_to(tls_stream)
        # RFC 3207: the client must start over with EHLO; nothing from before carries over.
        self.tls = True
        self.greeted = False
        self.reset_transaction()

    async def mail(self, argument: str) -> None:
        match = _PATH_ARG.match(argument)
        if not self.greeted:
            await self.reply(503, "5.5.1 say EHLO first")
        elif self.mail_from is not None:
            await self.reply(503, "5.5.1 nested MAIL command")
        elif match is None or match[1].upper() != "FROM":
            await self.reply(501, "5.5.4 syntax: MAIL FROM:<address>")
        else:
            await self.mail_with_params(match[2], match[3].split())

    async def mail_with_params(self, sender: str, params: list[str]) -> None:
        smtputf8 = False
        for param in params:
            key, _, value = param.partition("=")
            if key.upper() == "SMTPUTF8" and self.sink.smtputf8 and not value:
                smtputf8 = True
            elif key.upper() == "REQUIRETLS" and self.sink.requiretls and self.tls and not value:
                continue
            elif key.upper() == "SIZE" and value.isdigit():
                if int(value) > self.sink.max_message_size:
                    await self.reply(552, "5.3.4 message size exceeds fixed limit")
                    return
            elif key.upper() != "BODY":
                # Strict on purpose: e.g. SMTPUTF8 was not advertised, so must not be used.
                await self.reply(555, f"5.5.4 unsupported parameter {param}")
                return
        if not (smtputf8 or sender.isascii()):
            await self.reply(553, "5.6.7 non-ASCII address without SMTPUTF8")
            return
        self.mail_from = sender
        self.smtputf8 = smtputf8
        sink = self.sink
        sink.open_transactions += 1
        sink.most_open_transactions = max(sink.most_open_transactions, sink.open_transactions)
        domain = _domain_of(sender)
        sink.open_by_sender[domain] += 1
        sink.most_open_by_sender[domain] = max(
            sink.most_open_by_sender[domain], sink.open_by_sender[domain]
        )
        sink.mail_times.append(trio.current_time())
        await self.reply(250, "2.1.0 OK")

    async def rcpt(self, argument: str) -> None:
        match = _PATH_ARG.match(argument)
        if self.mail_from is None:
            await self.reply(503, "5.5.1 need MAIL first")
        elif match is None or match[1].upper() != "TO" or not match[2]:
            await self.reply(501, "5.5.4 syntax: RCPT TO:<address>")
        elif not (self.smtputf8 or match[2].isascii()):
            await self.reply(553, "5.6.7 non-ASCII address without SMTPUTF8")
        else:
            answer = self.sink.rcpt_reply(match[2])
            if answer.accepted:
                self.rcpt_to.append(match[2])
            await self.reply(answer.code, answer.text)

    async def data(self, argument: str) -> None:
        if self.mail_from is None:
            await self.reply(503, "5.5.1 need MAIL first")
            return
        if not self.rcpt_to:
            await self.reply(554, "5.5.1 no valid recipients")
            return
        await self.reply(354, "end data with <CR><LF>.<CR><LF>")
        self.sink.past_data += 1
        try:
            outcome, data = await self.receive_data()
            header = data.split(b"\r\n\r\n", 1)[0]
            if outcome is None and not (self.smtputf8 or header.isascii()):
                outcome = SmtpReply(554, "5.6.7 8-bit header octets without SMTPUTF8")
            if outcome is None:
                outcome = self.sink.next_data_reply()
                if outcome.accepted:
                    self.sink.record(
                        ReceivedMessage(
                            mail_from=self.mail_from,
                            rcpt_to=tuple(self.rcpt_to),
                            data=data,
                            tls=self.tls,
                            received_at=trio.current_time(),
                            smtputf8=self.smtputf8,
                            peer=self.peer,
                            helo=self.greeting,
                        )
                    )
            if self.sink.data_delay:
                await trio.sleep(self.sink.data_delay)
            await self.reply(outcome.code, outcome.text)
        finally:
            self.sink.past_data -= 1
        self.reset_transaction()  # after the reply: the sender waits for it

    async def receive_data(self) -> tuple[SmtpReply | None, bytes]:
        """Read up to the lone "."; return (error reply or None, unstuffed content).

        On an error the rest of the message is still consumed (but not kept), so the
        session stays in sync with a pipelining client.
        """
        content = _Content(self.sink.max_message_size)
        while True:
            block = self.reader.take_lines()
            if not block:  # no whole line buffered: wait for one, dropping an over-long one
                try:
                    line = await self.reader.readline()
                except _LineTooLong:
                    content.refuse(SmtpReply(500, "5.5.2 line too long"))
                    continue
                if line is None:
                    raise trio.BrokenResourceError("connection closed during DATA")
                if line == b".":
                    return content.error, content.data()
                content.add_line(line)
                continue
            lines = block.split(b"\n")[:-1]
            if b"\n." in block or block.startswith(b".") or max(map(len, lines)) >= MAX_LINE:
                # The end, a stuffed dot or an over-long line is in there: line by line.
                for i, line in enumerate(lines):
                    if len(line) + 1 > MAX_LINE:  # with its line end, as readline counts
                        content.refuse(SmtpReply(500, "5.5.2 line too long"))
                    elif line.removesuffix(b"\r") == b".":
                        self.reader.put_back(b"".join(rest + b"\n" for rest in lines[i + 1 :]))
                        return content.error, content.data()
                    else:
                        content.add_line(line.removesuffix(b"\r"))
            else:  # plain lines, as good as all of a message: kept at once, ends made CRLF
                content.add(block.replace(b"\r\n", b"\n").replace(b"\n", b"\r\n"))

    async def rset(self, argument: str) -> None:
        self.reset_transaction()
        await self.reply(250, "2.0.0 OK")

    async def noop(self, argument: str) -> None:
        await self.reply(250, "2.0.0 OK")

    def leave(self) -> None:
        """The client is done with this connection: it no longer counts as open (once)."""
        if not self.left:
            self.left = True
            self.sink.open_connections -= 1

    async def quit(self, argument: str) -> None:
        self.leave()  # before the reply: the client may connect again as soon as it has it
        await self.reply(221, "2.0.0 bye")
        self.done = True
