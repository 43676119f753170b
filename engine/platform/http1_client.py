"""A pooled HTTP/1.1 client on Trio and h11: what outbound POSTs (webhooks, forwards) and
GETs (MTA-STS policies) need.

Chosen by measurement over httpx 0.28 (bench/http_clients.py: 16 keep-alive TLS connections
to one receiver, 64 concurrent POSTs): 0.65 ms of CPU per POST against 3.5 ms through httpx
with keep-alive tuned and a limiter in front of its pool; httpcore writes headers and body as
separate TLS records and rescans its pool for every request. The URL is still read by
httpx's parser, the one that checks it when it is saved (engine/platform/outbound_http.py).

The rules it keeps:
- per origin (scheme, host, port) at most `per_origin` connections, each kept alive for
  `KEEPALIVE` seconds of idleness; idle connections of origins not used for that long are
  closed as other requests pass, so a service calling many endpoints holds few sockets;
- an idle connection the peer has closed (readable at rest) is dropped before use, and a
  request on a reused connection that dies before any answer arrived is sent once more on a
  new one (the peer closed it as we wrote; it saw nothing);
- every connection goes through the `connect` it was given (the caller's address rule), then
  TLS with the caller's context, verifying the URL's host name;
- an answer body is read up to `MAX_ANSWER` bytes (a longer one is cut and its connection
  closed); redirects are answers like any other. Anything that keeps a request from being
  answered is an `HttpError` carrying its cause; the caller sets the deadline.
"""

from __future__ import annotations

import codecs
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

import h11
import httpx
import trio

KEEPALIVE = 5.0  # seconds an idle connection is kept (httpx's default too)
PER_ORIGIN = 16
MAX_ANSWER = 64 * 1024  # bytes of an answer's body read; callers keep far less
_READ_CHUNK = 65536

Connect = Callable[[str, int], Awaitable[trio.SocketStream]]
Origin = tuple[str, str, int]
_TRANSPORT_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class HttpError(Exception):
    """Raised when a request cannot be sent or gets no complete answer: a URL that cannot be
    sent to, the connection, TLS, the peer hanging up or breaking the protocol."""


class _Unanswered(Exception):
    """The connection failed before any byte of an answer: safe to send again elsewhere."""


@dataclass(frozen=True, slots=True)
class Reply:
    """An answer: its status, its body (at most MAX_ANSWER bytes) and its charset."""

    status: int
    body: bytes
    charset: str = "utf-8"

    @property
    def text(self) -> str:
        return self.body.decode(self.charset, errors="replace")


@dataclass(eq=False, slots=True)
class _Connection:
    stream: trio.abc.Stream
    socket: trio.socket.SocketType
    protocol: h11.Connection
    idle_since: float = 0.0

    def close(self) -> None:
        # Closing the socket itself is immediate: no TLS goodbye to wait for.
        self.socket.close()


class _Pool:
    """One origin's connections: a slot per connection that may exist, and the idle ones."""

    __slots__ = ("idle", "last_used", "retired", "slots")

    def __init__(self, size: int) -> None:
        self.slots = trio.Semaphore(size)
        self.idle: list[_Connection] = []
        self.last_used = 0.0
        self.retired = False  # dropped by the client: connections coming back are closed

    def take_idle(self, now: float) -> _Connection | None:
        while self.idle:
            connection = self.idle.pop()
            if now - connection.idle_since < KEEPALIVE and not connection.socket.is_readable():
                return connection
            connection.close()  # expired, or the peer closed it (or sent what we never asked)
        return None

    def retire(self) -> None:
        self.retired = True
        for connection in self.idle:
            connection.close()
        self.idle.clear()


def _charset(headers: list[tuple[bytes, bytes]]) -> str:
    for name, value in headers:
        if name == b"content-type":
            for part in value.decode("latin-1").split(";")[1:]:
                key, _, charset = part.strip().partition("=")
                if key.lower() == "charset":
                    try:
                        return codecs.lookup(charset.strip('"')).name
                    except LookupError:
                        break
    return "utf-8"


class Client:
    """Keep-alive HTTP/1.1 requests to any number of origins (use one per actor)."""

    def __init__(self, tls: ssl.SSLContext, connect: Connect, per_origin: int = PER_ORIGIN):
        self._tls = tls
        self._connect = connect
        self._per_origin = per_origin
        self._pools: dict[Origin, _Pool] = {}  # least recently used first

    async def post(self, url: str, body: bytes, headers: Mapping[str, str]) -> Reply:
        """POST `body` to `url` with `headers` (Host and Content-Length are added)."""
        return await self._request("POST", url, body, headers)

    async def get(self, url: str, headers: Mapping[str, str]) -> Reply:
        """GET `url` with `headers` (Host is added)."""
        return await self._request("GET", url, None, headers)

    async def _request(
        self, method: str, url: str, body: bytes | None, headers: Mapping[str, str]
    ) -> Reply:
        try:
            target = httpx.URL(url)
            scheme, host, port = target.scheme, target.host, target.port
            length = () if body is None else (("Content-Length", str(len(body))),)
            request = h11.Request(
                method=method,
                target=target.raw_path,
                headers=[("Host", target.netloc.decode("ascii")), *length, *headers.items()],
            )
        except (httpx.InvalidURL, h11.LocalProtocolError, ValueError) as exc:
            raise HttpError(f"cannot send to {url!r}: {exc}") from exc
        if scheme not in ("https", "http") or not host:
            raise HttpError(f"cannot send to {url!r}: not an http(s) URL with a host")
        origin = (scheme, host, port or (443 if scheme == "https" else 80))
        now = trio.current_time()
        pool = self._pools.pop(origin, None) or _Pool(self._per_origin)
        self._pools[origin] = pool  # now the most recently used
        pool.last_used = now
        self._close_unused(now)
        async with pool.slots:
            return await self._exchange(pool, origin, request, body or b"")

    async def aclose(self) -> None:
        """Close every idle connection (requests under way close theirs when they end)."""
        for pool in self._pools.values():
            pool.retire()
        self._pools.clear()

    def _close_unused(self, now: float) -> None:
        while self._pools:
            origin, pool = next(iter(self._pools.items()))
            if now - pool.last_used < KEEPALIVE:
                return
            pool.retire()
            del self._pools[origin]  # requests still under way close their connections

    async def _exchange(
        self, pool: _Pool, origin: Origin, request: h11.Request, body: bytes
    ) -> Reply:
        connection = pool.take_idle(trio.current_time())
        if connection is not None:
            try:
                return await self._send(pool, connection, request, body)
            except _Unanswered:
                pass  # the peer closed the kept-alive connection as we wrote: once more, anew
        connection = await self._open(origin)
        try:
            return await self._send(pool, connection, request, body)
        except _Unanswered as exc:
            raise HttpError(f"{origin[1]} closed the connection without answering") from (
                exc.__cause__
            )

    async def _open(self, origin: Origin) -> _Connection:
        scheme, host, port = origin
        try:
            tcp = await self._connect(host, port)
        except HttpError:
            raise
        except OSError as exc:
            raise HttpError(f"could not connect to {host} port {port}") from exc
        stream: trio.abc.Stream = tcp
        if scheme == "https":
            # https_compatible: a peer that closes without TLS's goodbye is an end, not an error.
            tls = trio.SSLStream(tcp, self._tls, server_hostname=host, https_compatible=True)
            try:
                await tls.do_handshake()
            except BaseException as exc:
                tcp.socket.close()
                if isinstance(exc, _TRANSPORT_ERRORS):
                    raise HttpError(f"TLS with {host} failed") from exc
                raise
            stream = tls
        return _Connection(stream, tcp.socket, h11.Connection(h11.CLIENT))

    async def _send(
        self, pool: _Pool, connection: _Connection, request: h11.Request, body: bytes
    ) -> Reply:
        """One request and its answer on `connection`, which goes back to the pool if the
        exchange left it reusable and is closed otherwise."""
        reusable = False
        try:
            protocol = connection.protocol
            data = (
                protocol.send(request)
                + protocol.send(h11.Data(data=body))
                + protocol.send(h11.EndOfMessage())
            )
            try:
                await connection.stream.send_all(data)
            except _TRANSPORT_ERRORS as exc:
                raise _Unanswered from exc
            reply, complete = await _read_reply(connection)
            if complete and protocol.our_state is h11.DONE and protocol.their_state is h11.DONE:
                protocol.start_next_cycle()
                reusable = True
            return reply
        finally:
            if reusable and not pool.retired:
                connection.idle_since = trio.current_time()
                pool.idle.append(connection)
            else:
                connection.close()


async def _read_reply(connection: _Connection) -> tuple[Reply, bool]:
    """The answer, and whether it was read to its end (a cut one leaves bytes unread)."""
    protocol = connection.protocol
    answer: h11.Response | None = None
    chunks: list[bytes] = []
    size = 0
    while True:
        try:
            event = protocol.next_event()
            if event is h11.NEED_DATA:
                # b"" at the end of the stream tells h11 the peer closed.
                protocol.receive_data(bytes(await connection.stream.receive_some(_READ_CHUNK)))
                continue
        except (*_TRANSPORT_ERRORS, h11.RemoteProtocolError) as exc:
            if answer is None:
                raise _Unanswered from exc
            raise HttpError("the answer broke off") from exc
        if isinstance(event, h11.Response):
            answer = event
        elif isinstance(event, h11.Data):
            chunks.append(event.data)
            size += len(event.data)
            if size > MAX_ANSWER:
                break
        elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
            break
    if answer is None:
        raise _Unanswered
    body = b"".join(chunks)[:MAX_ANSWER]
    return Reply(answer.status_code, body, _charset(list(answer.headers))), size <= MAX_ANSWER
