"""The account: who is signed in, changing the password, two-factor sign-in (its own page,
engine/accounts/totp.py), the workspace's plan and what it uses of each limit, and what agents
may do through the MCP door (engine/agents/policy.py)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.mcp_policy import PolicyChange
from api.routes.sessions import client_address
from console.web import form, go, page, parse, problems_of, rt, who
from engine import plans
from engine.accounts import roles, totp, users, workspaces
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
        two_factor=await totp.status(rt(), principal),
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


class TwoFactorCode(BaseModel):
    code: str = Field(min_length=6, max_length=40)


class TwoFactorOff(BaseModel):
    """A current code or the password (the form offers both; one is enough)."""

    code: str | None = Field(None, min_length=6, max_length=40)
    password: str | None = Field(None, min_length=1, max_length=1024)


async def _two_factor(status: int = 200, **extra: Any) -> Response:
    """The two-factor page: enrol (the secret until confirmed), the recovery codes once, or
    turning it off; and the owner's requirement for the workspace."""
    principal = who()
    extra.setdefault("problems", {})
    done = {
        "off": "Two-factor sign-in is off.",
        "required": "Every member now needs two-factor sign-in to use this workspace.",
        "not_required": "Two-factor sign-in is no longer required in this workspace.",
    }
    return await page(
        "two_factor.html",
        status=status,
        title="Two-factor sign-in",
        two_factor=await totp.status(rt(), principal),
        enrolment=await totp.pending_enrolment(rt(), principal),
        may_require=roles.may(principal.role, roles.SECURITY),
        notice=done.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/account/two-factor")
async def two_factor() -> Response:
    return await _two_factor()


@blueprint.post("/account/two-factor/enrol")
async def two_factor_enrol() -> Response:
    try:
        await totp.enrol(rt(), who())
    except EngineError as exc:
        return await _two_factor(status_of(exc), problems=problems_of(exc))
    return go("console.account.two_factor")


@blueprint.post("/account/two-factor/confirm")
async def two_factor_confirm() -> Response:
    body, problems = parse(TwoFactorCode, await form())
    if body is None:
        return await _two_factor(422, problems=problems)
    try:
        codes = await totp.confirm(rt(), who(), body.code, client_address())
    except EngineError as exc:
        return await _two_factor(status_of(exc), problems={"code": exc.detail})
    return await _two_factor(recovery_codes=codes)


@blueprint.post("/account/two-factor/disable")
async def two_factor_disable() -> Response:
    fields = await form()
    proof = {name: fields.get(name) or None for name in ("code", "password")}
    body, problems = parse(TwoFactorOff, proof)
    if body is not None and (body.code is None) == (body.password is None):
        problems = {"code": "give either a current code or the password"}
    if body is None or problems:
        return await _two_factor(422, problems=problems)
    try:
        await totp.disable(
            rt(), who(), code=body.code, password=body.password, client=client_address()
        )
    except EngineError as exc:
        return await _two_factor(status_of(exc), problems={"form": exc.detail})
    return go("console.account.two_factor", done="off")


@blueprint.post("/account/two-factor/requirement")
async def two_factor_requirement() -> Response:
    required = (await form()).get("required") == "on"
    try:
        await totp.set_required(rt(), who(), required)
    except EngineError as exc:
        return await _two_factor(status_of(exc), problems={"form": exc.detail})
    return go("console.account.two_factor", done="required" if required else "not_required")
