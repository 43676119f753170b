"""An HTTPS server on 127.0.0.1 that records requests, standing in for webhook endpoints.

Every complete request is recorded as a ``ReceivedRequest``. Replies default to
``200`` with the JSON body ``{}``; ``respond`` changes the default and
``respond_sequence`` scripts the next few replies (e.g. 500, 500, 200 for retry tests).
A reply's delay uses ``trio.sleep``, so it costs nothing under a virtual clock.

HTTP/1.1 via h11 over ``trio.SSLStream``, with keep-alive. Bodies over 10 MiB get 413
and the connection is closed; such requests are not recorded and consume no script.
"""

from __future__ import annotations

import contextlib
import json
import ssl
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

import h11
import trio

from tests.harness.peer import HOST, Arrivals, LoopbackPeer

MAX_BODY = 10 * 1024 * 1024
_MAX_HEADER_BYTES = 64 * 1024
_READ_CHUNK = 65536
_DRAIN_LIMIT = 4 * MAX_BODY
_DRAIN_SECONDS = 5.0


@dataclass(frozen=True)
class ReceivedRequest:
    method: str
    path: str  # the request target as sent, query string included
    headers: dict[str, str]  # lowercase names; repeated headers joined with ", "
    body: bytes
    received_at: float  # trio.current_time()

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass(frozen=True)
class HttpReply:
    status: int
    body: bytes = b""
    delay: float = 0.0  # seconds slept before answering
    headers: tuple[tuple[str, str], ...] = ()  # e.g. (("retry-after", "30"),)


def _reply(
    status: int,
    body: bytes | str = b"",
    delay: float = 0.0,
    headers: Mapping[str, str] | None = None,
) -> HttpReply:
    raw = body.encode() if isinstance(body, str) else body
    return HttpReply(status, raw, delay, tuple((headers or {}).items()))


class _TooLarge(Exception):
    pass


class HttpsReceiver(LoopbackPeer):
    """Scriptable HTTPS endpoint; start it with ``await nursery.start(receiver.run)``."""

    def __init__(self, ssl_context: ssl.SSLContext) -> None:
        self.ssl_context = ssl_context
        self._arrivals: Arrivals[ReceivedRequest] = Arrivals()
        self.requests = self._arrivals.items
        self.connections = 0  # accepted TCP connections, to observe keep-alive
        self._default = HttpReply(200, b"{}")
        self._script: deque[HttpReply] = deque()

    # -- scripting -------------------------------------------------------------------

    def respond(
        self,
        status: int,
        body: bytes | str = b"",
        delay: float = 0.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        """Set the reply used whenever no scripted reply is pending."""
        self._default = _reply(status, body, delay, headers)

    def respond_sequence(self, replies: Iterable[int | HttpReply]) -> None:
        """Queue replies for the next requests, in order; plain ints are empty-bodied."""
        self._script.extend(r if isinstance(r, HttpReply) else HttpReply(r) for r in replies)

    def next_reply(self) -> HttpReply:
        """The reply for the request now complete (consumes the script first)."""
        return self._script.popleft() if self._script else self._default

    async def wait_for_requests(
        self,
        n: int,
        timeout: float = 10,  # noqa: ASYNC109 - a built-in deadline keeps tests terse
    ) -> list[ReceivedRequest]:
        """Wait until at least ``n`` requests were recorded; return all so far."""
        return await self._arrivals.wait_for(n, timeout)

    def record(self, request: ReceivedRequest) -> None:
        """Store a request and wake ``wait_for_requests``."""
        self._arrivals.add(request)

    # -- addressing and lifecycle ----------------------------------------------------

    @property
    def url(self) -> str:
        return f"https://{HOST}:{self.port}"

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``nursery.start`` returns the bound port."""
        serve = partial(
            trio.serve_ssl_over_tcp,
            self._handle,
            0,
            self.ssl_context,
            host=HOST,
            https_compatible=True,
        )
        async with trio.open_nursery() as nursery:
            listeners = await nursery.start(serve)
            self._port = listeners[0].transport_listener.socket.getsockname()[1]
            task_status.started(self.port)

    async def _handle(self, stream: trio.SSLStream[trio.SocketStream]) -> None:
        self.connections += 1
        # Hang-ups and failed handshakes end the connection, never the server.
        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
            await _serve_connection(self, stream)


async def _serve_connection(receiver: HttpsReceiver, stream: trio.abc.Stream) -> None:
    """Keep-alive loop: read a request, record it, answer it, repeat until close."""
    conn = h11.Connection(h11.SERVER, max_incomplete_event_size=_MAX_HEADER_BYTES)
    while True:
        try:
            request = await _read_request(conn, stream)
        except _TooLarge:
            await _send(conn, stream, HttpReply(413, b'{"error": "body too large"}'), close=True)
            await _drain(stream)
            return
        except h11.RemoteProtocolError as exc:
            if conn.our_state in (h11.IDLE, h11.SEND_RESPONSE):
                await _send(conn, stream, HttpReply(exc.error_status_hint), close=True)
            return
        if request is None:
            return
        receiver.record(request)
        reply = receiver.next_reply()
        if reply.delay:
            await trio.sleep(reply.delay)
        await _send(conn, stream, reply)
        if conn.our_state is h11.MUST_CLOSE:
            return
        conn.start_next_cycle()


async def _drain(stream: trio.abc.Stream) -> None:
    """Swallow what the client still sends before we close ("lingering close").

    Closing with unread bytes makes the kernel send RST, which can destroy our 413 in
    the client's receive buffer before it reads it; so read until EOF, within bounds.
    """
    budget = _DRAIN_LIMIT
    with trio.move_on_after(_DRAIN_SECONDS):
        while budget > 0 and (chunk := await stream.receive_some(_READ_CHUNK)):
            budget -= len(chunk)


async def _next_event(conn: h11.Connection, stream: trio.abc.Stream) -> Any:
    while True:
        event = conn.next_event()
        if event is not h11.NEED_DATA:
            return event
        # b"" at EOF tells h11 the peer closed; it then yields ConnectionClosed.
        conn.receive_data(bytes(await stream.receive_some(_READ_CHUNK)))


async def _read_request(conn: h11.Connection, stream: trio.abc.Stream) -> ReceivedRequest | None:
    """The next complete request, or None when the client closed the connection."""
    start = await _next_event(conn, stream)
    if isinstance(start, h11.ConnectionClosed):
        return None
    assert isinstance(start, h11.Request)
    headers: dict[str, str] = {}
    for name, value in start.headers:
        key, text = name.decode("latin-1"), value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    if int(headers.get("content-length", "0")) > MAX_BODY:
        raise _TooLarge  # refuse before reading a byte of it
    body = bytearray()
    while not isinstance(event := await _next_event(conn, stream), h11.EndOfMessage):
        body += event.data
        if len(body) > MAX_BODY:  # chunked bodies declare no length up front
            raise _TooLarge
    return ReceivedRequest(
        method=start.method.decode("ascii"),
        path=start.target.decode("latin-1"),
        headers=headers,
        body=bytes(body),
        received_at=trio.current_time(),
    )


async def _send(
    conn: h11.Connection, stream: trio.abc.Stream, reply: HttpReply, *, close: bool = False
) -> None:
    headers = [
        ("content-type", "application/json"),
        ("content-length", str(len(reply.body))),
        *reply.headers,
    ]
    if close:  # we answer before the request ended: the unread rest of it is unusable
        headers.append(("connection", "close"))
    events: list[h11.Response | h11.Data | h11.EndOfMessage] = [
        h11.Response(status_code=reply.status, headers=headers),
        h11.Data(data=reply.body),
        h11.EndOfMessage(),
    ]
    await stream.send_all(b"".join(conn.send(event) or b"" for event in events))
