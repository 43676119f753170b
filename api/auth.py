"""Authentication of every `/v1` request: a Bearer API key or the session cookie.

Routes are private unless marked `@public`. Cookie sessions must prove same origin on unsafe
methods (CSRF): their `Origin` header must equal the public URL's origin. Platform-admin
routes additionally need `is_admin` and a re-authentication less than five minutes old. A
sandbox test key reaches only what api/test_keys.py allows it, and a change needs a role that
may make it (api/permissions.py).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar
from urllib.parse import urlsplit

from quart import Quart, Response, current_app, g, request

from api import permissions, test_keys
from engine.accounts import users
from engine.accounts.auth import authenticate_key, authenticate_session
from engine.accounts.users import SESSION_COOKIE
from engine.platform.errors import Forbidden, Unauthorized
from engine.platform.runtime import Principal, Runtime

F = TypeVar("F", bound=Callable[..., Any])

_SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})


def public(handler: F) -> F:
    """Mark a route as needing no authentication."""
    handler._postroom_public = True  # type: ignore[attr-defined]
    return handler


def credential_optional(handler: F) -> F:
    """Mark a route whose path carries its credential: callers may also authenticate."""
    handler._postroom_credential_optional = True  # type: ignore[attr-defined]
    return handler


def optional_principal() -> Principal | None:
    """The caller of a `credential_optional` route, or None when it sent no credentials."""
    who: Principal | None = g.get("principal")
    return who


def principal() -> Principal:
    """The authenticated caller of the current request."""
    who: Principal = g.principal
    return who


def runtime() -> Runtime:
    """The engine runtime the app was built with."""
    rt: Runtime = current_app.extensions["postroom"]
    return rt


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def check_same_origin(rt: Runtime) -> None:
    """CSRF: a cookie-authenticated unsafe request must come from the public URL's origin
    (the API's and the console's one rule)."""
    if request.method in _SAFE_METHODS:
        return
    if request.headers.get("Origin", "").lower() != origin_of(rt.public_url):
        raise Forbidden(
            "cross-site request refused: Origin must match the service's public URL",
            code="csrf_failed",
        )


def set_session_cookie(response: Response, rt: Runtime, logged_in: users.LoggedIn) -> None:
    """Hand the browser its session cookie (`postroom_session`)."""
    response.set_cookie(
        SESSION_COOKIE,
        logged_in.token,
        max_age=int(users.SESSION_LIFETIME.total_seconds()),
        httponly=True,
        secure=rt.public_url.startswith("https://"),
        samesite="Lax",
        path="/",
    )


def bearer_credential(authorization: str) -> str:
    """The API key of an `Authorization` header; Unauthorized for any other scheme."""
    scheme, _, credential = authorization.partition(" ")
    if scheme.lower() != "bearer" or not credential.strip():
        raise Unauthorized("use 'Authorization: Bearer <API key>'")
    return credential.strip()


def install(app: Quart, rt: Runtime) -> None:
    """Authenticate each request before its route runs."""

    @app.before_request
    async def authenticate() -> None:
        endpoint = request.endpoint
        view = current_app.view_functions.get(endpoint) if endpoint else None
        if view is None or getattr(view, "_postroom_public", False):
            return
        if not request.path.startswith("/v1/"):
            return
        authorization = request.headers.get("Authorization")
        if authorization is not None:
            who = await authenticate_key(rt, bearer_credential(authorization))
            changes = request.method not in _SAFE_METHODS
            if who.test_key:
                test_keys.refuse_outside_sandbox(endpoint or "", changes)
            if changes:
                permissions.authorise_change(who, endpoint or "")
            g.principal = who
            return
        token = request.cookies.get(SESSION_COOKIE)
        if token is None and getattr(view, "_postroom_credential_optional", False):
            return
        if token is None:
            raise Unauthorized("authentication required: send an API key or log in")
        check_same_origin(rt)
        session = await authenticate_session(rt, token, request.headers.get("X-Workspace-Id"))
        permissions.require_two_factor(session.two_factor_missing, endpoint or "")
        if request.method not in _SAFE_METHODS:
            permissions.authorise_change(session.principal, endpoint or "")
        g.principal = session.principal
        g.reauthenticated_until = session.reauthenticated_until
