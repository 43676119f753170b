"""`/v1/auth/`: password login to a session cookie, logout, and re-authentication. A user with
two-factor sign-in gets a pending-login token instead (202), for api/routes/totp.py.

Password attempts are limited per account and per client address (engine.login_limits); the
address is the connection's peer as hypercorn reports it, never an X-Forwarded-For header,
which any client can write.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from quart import Blueprint, Response, jsonify, request
from quart_schema import document_response

from api.auth import principal, public, runtime, set_session_cookie
from api.models import EmailText, In
from api.validation import json_body
from engine.accounts import users as accounts

blueprint = Blueprint("sessions", __name__, url_prefix="/v1/auth")


def client_address() -> str | None:
    """The peer address of the request's connection (the ASGI scope's `client`)."""
    client = request.scope.get("client")
    return client[0] if client else None


class Login(In):
    email: EmailText
    password: str = Field(min_length=1, max_length=1024)


class Reauth(In):
    password: str = Field(min_length=1, max_length=1024)


class WorkspaceOut(BaseModel):
    id: str
    name: str
    plan: str


class LoginOut(BaseModel):
    user_id: str
    email: str
    is_admin: bool
    workspaces: list[WorkspaceOut]
    expires_at: datetime


class PendingLoginOut(BaseModel):
    """A password login of a user with two-factor sign-in: no session yet. Send the token and
    a code to `POST /v1/auth/totp/login` before `expires_at`."""

    second_factor: str = "totp"
    pending_token: str
    expires_at: datetime


def login_out(session: accounts.LoggedIn) -> dict[str, object]:
    """The answer of a login that opened a session."""
    out = LoginOut(
        user_id=session.user.id,
        email=session.user.email,
        is_admin=session.user.is_admin,
        workspaces=[WorkspaceOut(id=w.id, name=w.name, plan=w.plan) for w in session.workspaces],
        expires_at=session.expires_at,
    )
    return out.model_dump(mode="json")


@blueprint.post("/login")
@public
@json_body(Login)
@document_response(LoginOut)
@document_response(PendingLoginOut, 202)
async def login(body: Login) -> Response:
    rt = runtime()
    session = await accounts.login(rt, body.email, body.password, client_address())
    if isinstance(session, accounts.SecondFactorNeeded):
        pending = PendingLoginOut(
            pending_token=session.pending_token, expires_at=session.expires_at
        )
        return Response(pending.model_dump_json(), status=202, content_type="application/json")
    response = jsonify(login_out(session))
    set_session_cookie(response, rt, session)
    return response


@blueprint.post("/logout")
async def logout() -> Response:
    await accounts.logout(runtime(), principal())
    response = Response(b"", status=204)
    response.delete_cookie(accounts.SESSION_COOKIE, path="/")
    return response


class ReauthOut(BaseModel):
    reauthenticated_until: datetime


@blueprint.post("/reauth")
@json_body(Reauth)
@document_response(ReauthOut)
async def reauth(body: Reauth) -> dict[str, object]:
    until = await accounts.reauthenticate(runtime(), principal(), body.password, client_address())
    return ReauthOut(reauthenticated_until=until).model_dump(mode="json")
