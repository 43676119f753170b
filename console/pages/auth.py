"""Sign in, sign out, and the first run: while the service has no user, a one-time form
creates the first account (a platform administrator) with its workspace and first API key."""

from __future__ import annotations

from pydantic import BaseModel, Field
from quart import Blueprint, Response

from api.auth import set_session_cookie
from api.models import EmailText
from api.routes.sessions import Login, client_address
from console.web import form, go, page, parse, public, rt, who
from engine import plans
from engine.accounts import users
from engine.platform.errors import EngineError

blueprint = Blueprint("auth", __name__)


class Setup(BaseModel):
    email: EmailText
    password: str = Field(min_length=users.MIN_PASSWORD_LENGTH, max_length=1024)
    plan: str = "business"


@blueprint.get("/login")
@public
async def login() -> Response:
    if not await users.is_set_up(rt()):
        return go("console.auth.setup")
    return await page("login.html", title="Sign in", values={}, problems={})


@blueprint.post("/login")
@public
async def sign_in() -> Response:
    values = await form()
    body, problems = parse(Login, values)
    if body is not None:
        try:
            session = await users.login(rt(), body.email, body.password, client_address())
        except EngineError as exc:
            problems = {"form": exc.detail}
        else:
            response = go("console.overview.index")
            set_session_cookie(response, rt(), session)
            return response
    values.pop("password", None)
    return await page("login.html", status=401, title="Sign in", values=values, problems=problems)


@blueprint.post("/logout")
async def sign_out() -> Response:
    await users.logout(rt(), who())
    response = go("console.auth.login")
    response.delete_cookie(users.SESSION_COOKIE, path="/")
    return response


@blueprint.get("/setup")
@public
async def setup() -> Response:
    if await users.is_set_up(rt()):
        return go("console.auth.login")
    return await page(
        "setup.html", title="First run", values={}, problems={}, plans=plans.PLAN_NAMES
    )


@blueprint.post("/setup")
@public
async def set_up() -> Response:
    values = await form()
    body, problems = parse(Setup, values)
    if body is not None:
        try:
            created = await users.create_account(
                rt(), body.email, body.password, body.plan, admin=True, first_user=True
            )
            session = await users.login(rt(), body.email, body.password, client_address())
        except EngineError as exc:
            problems = {"form": exc.detail}
        else:
            response = await page("welcome.html", title="Welcome", created=created)
            set_session_cookie(response, rt(), session)
            return response
    values.pop("password", None)
    return await page(
        "setup.html",
        status=422,
        title="First run",
        values=values,
        problems=problems,
        plans=plans.PLAN_NAMES,
    )
