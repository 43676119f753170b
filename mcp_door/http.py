"""The MCP door over Streamable HTTP: `/mcp` on the API's port, in the API's process.

Every POST is authenticated as on `/v1` (an API key as Bearer, or the session cookie with an
`Origin` equal to the public URL) and handed to the SDK's transport with the caller in its
ASGI scope (mcp_door/server.py reads it there).

The transport is stateless: `postroom serve` runs one process per core and several nodes may
share a database, so the next request of a client can land anywhere, and nothing of a
client's may live in one process. Clients of the 2026 protocol name themselves in every
request. A client of the handshake protocols names itself once, in `initialize`: its answer
carries an `Mcp-Session-Id` that is that name signed with the service's secret and bound to
the credential that sent it, so any node reads the name back from the client's later
requests; a session id presented with another credential, or altered, is 404 (the client
then initializes again). With nothing to stream, GET and DELETE are 405, as the protocol
allows.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import trio

from api.auth import origin_of
from api.errors import status_of
from api.permissions import require_two_factor
from engine.accounts.auth import authenticate_key, authenticate_session
from engine.accounts.users import SESSION_COOKIE
from engine.agents import clients
from engine.platform.errors import EngineError, Forbidden, RateLimited, StorageFull, Unauthorized
from engine.platform.runtime import Principal, Runtime
from engine.sending.tracking import sign, verify
from mcp_door.caller import CALLER, Caller

if TYPE_CHECKING:
    from mcp.server import Server
    from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
    from starlette.requests import Request

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Any  # (scope, receive, send) -> Awaitable[None], as Quart's and the SDK's are typed apart

PATH = "/mcp"
SESSION_HEADER = "mcp-session-id"
# The SDK's own limit on a request body; the largest tool argument is a 1 MB CSV or body.
MAX_BODY = 4 * 1024 * 1024
_SESSION_KIND = "mcp"  # what the signed session id is for (its other uses: tracking links)


async def _respond(send: Send, status: int, body: dict[str, Any], **headers: str) -> None:
    encoded = json.dumps(body).encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(encoded)).encode()),
                *((k.replace("_", "-").encode(), v.encode()) for k, v in headers.items()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": encoded})


async def _refuse(send: Send, exc: EngineError | StorageFull) -> None:
    if isinstance(exc, StorageFull):
        detail = "the service has no storage space left; try again later"
        await _respond(send, 507, {"code": "storage_full", "detail": detail}, retry_after="60")
        return
    body = {"code": exc.code, "detail": exc.detail, **exc.extra}
    if isinstance(exc, Unauthorized):
        await _respond(send, 401, body, www_authenticate='Bearer realm="postroom"')
    elif isinstance(exc, RateLimited):
        await _respond(send, 429, body, retry_after=str(exc.retry_after))
    else:
        await _respond(send, status_of(exc), body)


async def _session_gone(send: Send) -> None:
    # The protocol's answer to a session the server does not know: the client initializes
    # again. A JSON-RPC error without id, as the SDK answers it.
    error = {"code": -32600, "message": "Session not found"}
    await _respond(send, 404, {"jsonrpc": "2.0", "id": None, "error": error})


async def _read_body(receive: Receive) -> bytes | None:
    """The whole request body; None when it is over MAX_BODY."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b""  # the client went away; the transport sees an empty body
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _initializing_client(body: bytes) -> str | None:
    """The name a client gives in an `initialize` request; None for any other body."""
    try:
        message = json.loads(body)
    except (ValueError, RecursionError):  # the SDK answers it with its parse error
        return None
    if not isinstance(message, dict) or message.get("method") != "initialize":
        return None
    params = message.get("params")
    info = params.get("clientInfo") if isinstance(params, dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    # Folded to what the activity log keeps: the name rides in a header on every request.
    return clients.client_name(name if isinstance(name, str) else None)


def _binding(who: Principal) -> str:
    """The credential a session id is bound to: the API key, or the login session."""
    return f"{who.workspace_id}/{who.credential}"


def _build_server(rt: Runtime) -> Server[Any]:
    # On a worker thread: importing the SDK and building the tools' JSON schemas take
    # seconds on a busy machine, and the event loop goes on serving meanwhile.
    from mcp_door import server

    return server.build(rt)


class HttpDoor:
    """`/mcp` for one runtime: mount it on the API's ASGI app, and run it while serving."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._manager: StreamableHTTPSessionManager | None = None
        self._loaded = trio.Event()
        self._running = False

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """Serve MCP requests inside the block; enter it before the HTTP server starts and
        leave it after the server has drained. The SDK loads in the background, so the
        service is up without waiting for it; a request to /mcp before then waits."""
        async with trio.open_nursery() as nursery:
            self._running = True
            nursery.start_soon(self._run_manager)
            try:
                yield
            finally:
                self._running = False
                self._loaded.set()  # a request still waiting for the SDK hears 503
                nursery.cancel_scope.cancel()

    async def _run_manager(self) -> None:
        # Abandoned by a stop that comes while the SDK still loads (seconds on a busy host):
        # the stop does not wait for a server it will never use.
        built = await trio.to_thread.run_sync(_build_server, self._rt, abandon_on_cancel=True)
        from mcp.server.streamable_http_manager import StreamableHTTPSessionManager

        manager = StreamableHTTPSessionManager(app=built, json_response=True, stateless=True)
        async with manager.run():  # the SDK's task group for the requests it serves
            self._manager = manager
            self._loaded.set()
            await trio.sleep_forever()

    def mount(self, app: ASGIApp) -> ASGIApp:
        """`app` with `/mcp` answered by the door."""

        async def route(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and scope["path"].rstrip("/") == PATH:
                await self._serve(scope, receive, send)
            else:
                await app(scope, receive, send)

        return route

    async def _serve(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["method"] != "POST":
            detail = "the MCP door answers POST only: it is stateless and has nothing to stream"
            await _respond(
                send, 405, {"code": "method_not_allowed", "detail": detail}, allow="POST"
            )
            return
        await self._loaded.wait()
        if not self._running or self._manager is None:
            detail = "the service is stopping"
            await _respond(send, 503, {"code": "unavailable", "detail": detail})
            return
        from starlette.requests import Request  # loaded with the SDK by now

        request = Request(scope)
        try:
            who = await self._authenticate(request)
        except (EngineError, StorageFull) as exc:
            await _refuse(send, exc)
            return
        client = None
        if (session := request.headers.get(SESSION_HEADER)) is not None:
            claims = verify(self._rt.secret_key, session)
            if (
                claims is None
                or claims.get("k") != _SESSION_KIND
                or claims.get("p") != _binding(who)
            ):
                await _session_gone(send)
                return
            client = claims.get("c")
        body = await _read_body(receive)
        if body is None:
            detail = f"a request to the MCP door is at most {MAX_BODY} bytes"
            await _respond(send, 413, {"code": "payload_too_large", "detail": detail})
            return
        initializing = _initializing_client(body)
        session_id = None
        if initializing is not None:
            claims = {"k": _SESSION_KIND, "c": initializing, "p": _binding(who)}
            session_id = sign(self._rt.secret_key, claims)

        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send_with_session(message: Message) -> None:
            ok = message["type"] == "http.response.start" and message["status"] == 200
            if session_id is not None and ok:
                headers = [
                    *message.get("headers", []),
                    (SESSION_HEADER.encode(), session_id.encode()),
                ]
                message = {**message, "headers": headers}
            await send(message)

        scope = {**scope, CALLER: Caller(who, client)}
        await self._manager.handle_request(scope, replay, send_with_session)

    async def _authenticate(self, request: Request) -> Principal:
        """The caller, by the API's rules (api/auth.py): a Bearer API key, or the session
        cookie with the public URL's Origin (no other site may act with a browser's cookie).
        An Origin, when sent, must be the public URL's whatever the credential: the protocol
        asks it of every server (no page reached through DNS rebinding gets an answer)."""
        rt = self._rt
        origin = request.headers.get("origin")
        if origin is not None and origin.lower() != origin_of(rt.public_url):
            raise Forbidden(
                "cross-site request refused: Origin must match the service's public URL",
                code="csrf_failed",
            )
        authorization = request.headers.get("authorization")
        if authorization is not None:
            scheme, _, credential = authorization.partition(" ")
            if scheme.lower() != "bearer" or not credential.strip():
                raise Unauthorized("use 'Authorization: Bearer <API key>'")
            return await authenticate_key(rt, credential.strip())
        token = request.cookies.get(SESSION_COOKIE)
        if token is None:
            raise Unauthorized("authentication required: send an API key or log in")
        if origin is None:
            raise Forbidden(
                "a request with the session cookie must send the public URL as its Origin",
                code="csrf_failed",
            )
        session = await authenticate_session(rt, token, request.headers.get("x-workspace-id"))
        # No tool is one that sets up two-factor sign-in: a workspace requiring it refuses all.
        require_two_factor(session.two_factor_missing, "mcp")
        return session.principal
