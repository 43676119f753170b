"""`postroom mcp --stdio`: the MCP door for local clients, bridged to a running service.

A local client (a desktop assistant, an editor) starts this process and speaks MCP on its
stdin and stdout; each request goes on to the service's `/mcp` with the API key of
POSTROOM_API_KEY, under the name the client gave. The process holds nothing but that key: no
database URL and no master key, so an agent can do exactly what the workspace's policy lets
the door do, the service decides and records it (any node of it), and mail an agent sends is
delivered as promptly as any other.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import mcp_types as types
import trio
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.server import Server, ServerRequestContext
from mcp.server.stdio import stdio_server
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from mcp_door.instructions import INSTRUCTIONS

log = logging.getLogger("postroom.mcp")
T = TypeVar("T")


class Upstream:
    """The connection to the service's `/mcp`, opened at the first request under the name
    the local client gave, and opened again after it fails (the service restarted)."""

    def __init__(self, url: str, api_key: str, nursery: trio.Nursery) -> None:
        self.url = url
        self._api_key = api_key
        self._nursery = nursery
        self._lock = trio.Lock()
        self._client: Client | None = None
        self._release: trio.Event | None = None  # set: the current connection closes

    async def client(self, ctx: ServerRequestContext[Any, Any]) -> Client:
        params = ctx.session.client_params
        info = (
            params.client_info
            if params is not None
            else types.Implementation(name="", version="")  # the service logs it as unknown
        )
        async with self._lock:
            if self._client is None:
                release = trio.Event()
                self._client = await self._nursery.start(self._hold, info, release)
                self._release = release
            return self._client

    async def _hold(
        self,
        info: types.Implementation,
        release: trio.Event,
        *,
        task_status: trio.TaskStatus[Client],
    ) -> None:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {self._api_key}"})
        transport = streamable_http_client(self.url, http_client=http)
        client = None
        try:
            async with http, Client(transport, client_info=info) as client:
                task_status.started(client)
                await release.wait()
        except Exception:
            if client is None:
                raise  # to the request that was opening it
            log.warning("the connection to %s broke; the next request opens another", self.url)
            if self._client is client:
                self.reset()

    def reset(self) -> None:
        """Close the current connection; the next request opens a new one."""
        if self._release is not None:
            self._release.set()
        self._client = None
        self._release = None


def _unreachable(url: str, exc: BaseException) -> MCPError:
    # The SDK's task groups wrap the cause (a refused connection, a 401) in groups.
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    detail = f"cannot reach the Postroom service at {url}: {exc or type(exc).__name__}"
    return MCPError(types.INTERNAL_ERROR, detail, data={"code": "unreachable", "detail": detail})


def bridge(upstream: Upstream) -> Server[Any]:
    """A server that answers each request with the service's answer to it."""

    async def forward(
        ctx: ServerRequestContext[Any, Any], ask: Callable[[Client], Awaitable[T]]
    ) -> T:
        try:
            return await ask(await upstream.client(ctx))
        except MCPError as exc:  # the service's own answer, or a connection that closed
            if exc.code == types.CONNECTION_CLOSED:
                upstream.reset()
            raise
        except Exception as exc:  # no service there, or a bad key: this call says so
            upstream.reset()
            raise _unreachable(upstream.url, exc) from None

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        cursor = None if params is None else params.cursor
        return await forward(ctx, lambda client: client.list_tools(cursor=cursor))

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        return await forward(ctx, lambda client: client.call_tool(params.name, params.arguments))

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        cursor = None if params is None else params.cursor
        return await forward(ctx, lambda client: client.list_resources(cursor=cursor))

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        cursor = None if params is None else params.cursor
        return await forward(ctx, lambda client: client.list_resource_templates(cursor=cursor))

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        return await forward(ctx, lambda client: client.read_resource(params.uri))

    return Server(
        "postroom",
        version="1",
        instructions=INSTRUCTIONS,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )


async def serve(url: str, api_key: str) -> None:
    """Bridge MCP on stdin and stdout to the door at `url` until stdin closes."""
    async with trio.open_nursery() as nursery:
        upstream = Upstream(url, api_key, nursery)
        server = bridge(upstream)
        try:
            async with stdio_server() as (read, write):
                await server.run(read, write, server.create_initialization_options())
        finally:
            upstream.reset()
