"""The account: who is signed in, changing the password, the workspace's plan and what it uses
of each limit, and what agents may do through the MCP door (engine/agents/policy.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.mcp_policy import PolicyChange
from api.routes.sessions import client_address
from console.web import form, go, page, parse, problems_of, rt, who
from engine import plans
from engine.accounts import users, workspaces
from engine.agents import policy
from engine.platform.errors import EngineError

blueprint = Blueprint("account", __name__)


class ChangePassword(BaseModel):
    current_password: str = Field(min_length=1, max_length=1024)
    new_password: str = Field(min_length=users.MIN_PASSWORD_LENGTH, max_length=1024)


async def _index(status: int = 200, **extra: Any) -> Response:
    principal = who()
    extra.setdefault("problems", {})
    done = {
        "password": "Password changed: your other sessions were signed out.",
        "mcp": "MCP policy saved.",
    }
    return await page(
        "account.html",
        status=status,
        title="Account",
        usage=await workspaces.usage(rt(), principal),
        plan=plans.plan(principal.plan),
        unlimited=plans.UNLIMITED,
        mcp=await policy.current(rt(), principal),
        mcp_levels=policy.LEVELS,
        notice=done.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/account")
async def index() -> Response:
    return await _index()


@blueprint.post("/account/password")
async def change_password() -> Response:
    body, problems = parse(ChangePassword, await form())
    if body is None:
        return await _index(422, problems=problems)
    try:
        await users.change_password(
            rt(), who(), body.current_password, body.new_password, client_address()
        )
    except EngineError as exc:
        problem = problems_of(exc)
        if status_of(exc) == 401:  # a wrong current password, not a lapsed session
            problem = {"current_password": exc.detail}
        return await _index(422, problems=problem)
    return go("console.account.index", done="password")


@blueprint.post("/account/mcp")
async def change_mcp_policy() -> Response:
    """The MCP policy, by the API's model and the engine's one rule (a session only)."""
    fields = await form()
    cap = fields.get("max_recipients", "").strip()
    body, problems = parse(
        PolicyChange, {"policy": fields.get("policy") or None, "max_recipients": cap or None}
    )
    if body is None:
        return await _index(422, problems=problems)
    try:
        await policy.update(rt(), who(), body.policy, body.max_recipients)
    except EngineError as exc:
        return await _index(status_of(exc), problems=problems_of(exc))
    return go("console.account.index", done="mcp")
