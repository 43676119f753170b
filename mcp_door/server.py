"""The MCP server behind the door: the tools and resources, over one engine runtime.

Every call is made for the caller the transport authenticated (mcp_door/http.py puts it in
the request's ASGI scope) and held to its workspace's policy before anything else; the engine
calls of a tool run attributed to MCP and the client (engine/agents/clients.py), so every
activity entry they write says so, in the same transaction as the change. A tool's failure is
its result (`isError`, with the error body `{"code", "detail"}` the API uses), never a crash:
the agent reads it and can correct itself.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import mcp_types as types
import pydantic
from mcp.server import Server, ServerRequestContext
from mcp.shared.exceptions import MCPError

from api.validation import validation_error
from engine.agents import clients
from engine.agents import policy as agent_policy
from engine.agents.policy import READ, SEND
from engine.platform.errors import EngineError, NotFound, StorageFull, Unprocessable
from engine.platform.runtime import Runtime
from mcp_door import resources
from mcp_door.caller import CALLER, Caller
from mcp_door.instructions import INSTRUCTIONS
from mcp_door.shapes import Json
from mcp_door.tools import TOOLS, Tool

log = logging.getLogger("postroom.mcp")


def _caller(ctx: ServerRequestContext[Any, Any]) -> Caller:
    scope = getattr(ctx.request, "scope", None)
    caller = None if scope is None else scope.get(CALLER)
    if not isinstance(caller, Caller):  # only the HTTP door serves this server
        raise MCPError(types.INVALID_REQUEST, "unauthenticated")
    return caller


def _client(ctx: ServerRequestContext[Any, Any], caller: Caller) -> str | None:
    params = ctx.session.client_params  # the handshake's, or this request's envelope's
    return params.client_info.name if params is not None else caller.client


def _result(body: Json, *, error: bool = False) -> types.CallToolResult:
    return types.CallToolResult(
        content=[types.TextContent(text=json.dumps(body))],
        structured_content=body,
        is_error=error,
    )


def _failure(code: str, detail: str, **extra: Any) -> types.CallToolResult:
    return _result({"code": code, "detail": detail, **extra}, error=True)


def _arguments(tool: Tool, raw: dict[str, Any] | None) -> pydantic.BaseModel:
    arguments = raw or {}
    # PostgreSQL cannot store NUL in text, and no argument has a use for one (as on the API).
    if "\\u0000" in json.dumps(arguments):
        message = "NUL characters are not allowed"
        raise Unprocessable(message, errors=[{"loc": ["arguments"], "msg": message}])
    try:
        return tool.args.model_validate(arguments)
    except pydantic.ValidationError as exc:
        raise validation_error(exc, "arguments", tool.args) from None


def _listed(tool: Tool) -> types.Tool:
    if tool.needs == SEND:
        needs = "Needs the workspace's MCP policy `send`."
    else:
        needs = "Allowed under the MCP policy `read` (the default)."
    return types.Tool(
        name=tool.name,
        description=f"{tool.description}\n\n{needs}",
        input_schema=tool.args.model_json_schema(),
        annotations=types.ToolAnnotations(
            read_only_hint=tool.needs == READ, destructive_hint=False
        ),
    )


def build(rt: Runtime) -> Server[Any]:
    """The MCP server for the runtime's engine."""
    listed = [_listed(tool) for tool in TOOLS.values()]
    schemas = {tool.name: tool.input_schema for tool in listed}

    async def list_tools(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=listed)

    async def call_tool(
        ctx: ServerRequestContext[Any, Any], params: types.CallToolRequestParams
    ) -> types.CallToolResult:
        caller = _caller(ctx)
        tool = TOOLS.get(params.name)
        if tool is None:
            return _failure("unknown_tool", f"there is no tool named {params.name!r}")
        try:
            policy = await agent_policy.gate(rt, caller.who, tool.needs)
            args = _arguments(tool, params.arguments)
            with clients.acting_through_mcp(_client(ctx, caller)):
                return _result(await tool.run(rt, caller.who, policy, args))
        except EngineError as exc:
            return _failure(exc.code, exc.detail, **exc.extra)
        except StorageFull:
            return _failure("storage_full", "the service has no storage space left; try later")
        except Exception:
            log.exception("MCP tool %s failed", tool.name)
            return _failure("internal_error", "internal error; it has been logged")

    async def list_resources(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourcesResult:
        return types.ListResourcesResult(
            resources=[
                types.Resource(
                    uri=r.uri, name=r.name, description=r.description, mime_type=resources.MIME_TYPE
                )
                for r in resources.RESOURCES
            ]
        )

    async def list_resource_templates(
        ctx: ServerRequestContext[Any, Any], params: types.PaginatedRequestParams | None
    ) -> types.ListResourceTemplatesResult:
        return types.ListResourceTemplatesResult(
            resource_templates=[
                types.ResourceTemplate(
                    uri_template=t.uri_template,
                    name=t.name,
                    description=t.description,
                    mime_type=resources.MIME_TYPE,
                )
                for t in resources.ITEM_TEMPLATES
            ]
        )

    async def read_resource(
        ctx: ServerRequestContext[Any, Any], params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult:
        who = _caller(ctx).who
        try:
            await agent_policy.gate(rt, who, READ)
            body = await resources.read(rt, who, params.uri)
        except EngineError as exc:
            code = types.INVALID_PARAMS if isinstance(exc, NotFound) else types.INVALID_REQUEST
            error = {"code": exc.code, "detail": exc.detail, **exc.extra}
            raise MCPError(code, f"{exc.code}: {exc.detail}", data=error) from None
        return types.ReadResourceResult(
            contents=[
                types.TextResourceContents(
                    uri=params.uri, mime_type=resources.MIME_TYPE, text=json.dumps(body)
                )
            ]
        )

    return Server(
        "postroom",
        version="1",
        instructions=INSTRUCTIONS,
        # What the 2026 transport checks a call's Mcp-Param headers against, without a
        # tools/list per call.
        get_tool_input_schema=schemas.get,
        on_list_tools=list_tools,
        on_call_tool=call_tool,
        on_list_resources=list_resources,
        on_list_resource_templates=list_resource_templates,
        on_read_resource=read_resource,
    )
