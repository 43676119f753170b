"""Sign in, sign out, and the first run: while the service has no user, a one-time form
creates the first account (a platform administrator) with its workspace and first API key.

A person with two-factor sign-in gives the password, then a code (engine/accounts/totp.py): the
pending login waits in a cookie of its own, and the session cookie is set only after the code.
"""

from __future__ import annotations

from pydantic import BaseModel, Field
from quart import Blueprint, Response, request

from api.auth import set_session_cookie
from api.models import EmailText
from api.routes.sessions import Login, client_address
from console.web import form, go, page, parse, public, rt, who
from engine import plans
from engine.accounts import totp, users
from engine.platform.errors import EngineError

blueprint = Blueprint("auth", __name__)

PENDING_COOKIE = "postroom_pending_login"


class SecondStep(BaseModel):
    code: str = Field(min_length=6, max_length=40)


def _signed_in(session: users.LoggedIn) -> Response:
    response = go("console.overview.index")
    set_session_cookie(response, rt(), session)
    response.delete_cookie(PENDING_COOKIE, path="/")
    return response


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
            if isinstance(session, users.LoggedIn):
                return _signed_in(session)
            response = await page("login_code.html", title="Sign in", problems={})
            response.set_cookie(
                PENDING_COOKIE,
                session.pending_token,
                max_age=int(users.PENDING_LOGIN_LIFETIME.total_seconds()),
                httponly=True,
                secure=rt().public_url.startswith("https://"),
                samesite="Strict",
                path="/",
            )
            return response
    values.pop("password", None)
    return await page("login.html", status=401, title="Sign in", values=values, problems=problems)


@blueprint.get("/login/code")
@public
async def code() -> Response:
    if request.cookies.get(PENDING_COOKIE) is None:
        return go("console.auth.login")
    return await page("login_code.html", title="Sign in", problems={})


@blueprint.post("/login/code")
@public
async def finish_sign_in() -> Response:
    pending = request.cookies.get(PENDING_COOKIE)
    if pending is None:
        return go("console.auth.login")
    body, problems = parse(SecondStep, await form())
    if body is not None:
        try:
            session = await totp.finish_login(rt(), pending, body.code, client_address())
        except EngineError as exc:
            problems = {"code": exc.detail}
        else:
            return _signed_in(session)
    return await page("login_code.html", status=401, title="Sign in", problems=problems)


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
            if not isinstance(session, users.LoggedIn):  # a new account has no second factor
                return go("console.auth.code")
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
