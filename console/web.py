"""The console's frame: its blueprint, who is signed in, security headers, forms and rendering.

Pages are Jinja2 templates rendered on the server (console/templates/console/), enhanced by
the pinned copy of htmx in console/static/. Every page acts as the signed-in user in the
selected workspace through the engine functions the API calls; the session cookie and the
CSRF rule (an unsafe request's Origin must be the public URL's) are the API's (api/auth.py).
The workspace is the one named by `X-Workspace-Id` (htmx requests send it) or else by the
`postroom_workspace` cookie the switcher sets, else the user's oldest.

Every response carries a Content-Security-Policy without 'unsafe-inline': the pages have
no inline script or style, and email HTML is shown only inside a sandboxed frame whose
document has a policy of its own that runs nothing and loads nothing remote.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import pydantic
from quart import Blueprint, Response, current_app, g, redirect, render_template, request, url_for
from werkzeug.exceptions import NotFound as NoRoute

from api import permissions
from api.auth import check_same_origin, runtime
from api.errors import error_response, http_error_code, status_of
from api.validation import problem_message
from engine.accounts import users, workspaces
from engine.accounts.auth import authenticate_session
from engine.accounts.users import SESSION_COOKIE
from engine.accounts.workspaces import WorkspaceView
from engine.platform.errors import EngineError, NotFound, Unauthorized
from engine.platform.runtime import Principal, Runtime

blueprint = Blueprint(
    "console",
    __name__,
    template_folder="templates",
    static_folder="static",
    static_url_path="/assets",
)

HTMX = "htmx-2.0.11.min.js"  # npm htmx.org@2.0.11 (0BSD), unchanged
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
    " connect-src 'self'; form-action 'self'; frame-src 'self'; frame-ancestors 'none';"
    " base-uri 'none'"
)
# Email HTML, framed by the console only: no script, nothing remote (a tracking pixel would
# record an open, and a remote image tell its sender who reads), styles as the mail has them.
FRAMED_CSP = (
    "default-src 'none'; style-src 'unsafe-inline'; img-src data:; frame-ancestors 'self'; sandbox"
)
WORKSPACE_COOKIE = "postroom_workspace"
# The widths (CSS pixels) HTML previews are shown at, side by side: a desktop mail client's
# reading pane and a phone's screen.
PREVIEW_WIDTHS = (("Desktop", 640), ("Phone", 390))
# Browsers ask for /favicon.ico whatever the page says; it changes with a release at most.
FAVICON = (Path(__file__).parent / "static" / "favicon.svg").read_bytes()
FAVICON_CACHE = "public, max-age=31536000, immutable"

F = TypeVar("F", bound=Callable[..., Any])
M = TypeVar("M", bound=pydantic.BaseModel)


def public(view: F) -> F:
    """Mark a page that needs no session (sign-in, first run)."""
    view._console_public = True  # type: ignore[attr-defined]
    return view


def who() -> Principal:
    """The signed-in user, in the selected workspace."""
    found: Principal = g.principal
    return found


def rt() -> Runtime:
    return runtime()


def _wants_htmx() -> bool:
    return request.headers.get("HX-Request") == "true"


def go(endpoint: str, **values: Any) -> Response:
    """Send the browser on (303, so a form is not posted twice); htmx follows it whole."""
    target = url_for(endpoint, **values)
    if _wants_htmx():
        return Response(b"", status=204, headers={"HX-Redirect": target})
    response: Response = redirect(target, 303)  # type: ignore[assignment]
    return response


@blueprint.before_request
async def authenticate() -> Response | None:
    """Sign-in gate of every console page: a session, and same-origin unsafe requests."""
    endpoint = request.endpoint or ""
    if endpoint == "console.static":
        return None
    runtime_ = rt()
    check_same_origin(runtime_)
    view = current_app.view_functions.get(endpoint)
    if view is not None and getattr(view, "_console_public", False):
        return None
    token = request.cookies.get(SESSION_COOKIE)
    if token is None:
        return go("console.auth.login" if await users.is_set_up(runtime_) else "console.auth.setup")
    chosen = request.headers.get("X-Workspace-Id") or request.cookies.get(WORKSPACE_COOKIE)
    try:
        try:
            session = await authenticate_session(runtime_, token, chosen)
        except NotFound:  # the workspace remembered is not the user's any more
            session = await authenticate_session(runtime_, token, None)
    except Unauthorized:
        response = go("console.auth.login")
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response
    g.principal = session.principal
    if session.two_factor_missing and not permissions.allowed_without_two_factor(endpoint):
        return go("console.account.two_factor")
    if request.method not in ("GET", "HEAD", "OPTIONS"):
        permissions.authorise_change(session.principal, endpoint)
    return None


@blueprint.after_request
async def security_headers(response: Response) -> Response:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    if response.mimetype == "text/html":
        response.headers.setdefault("Cache-Control", "no-store")
    return response


def framed_html(html: str) -> Response:
    """Email HTML as a document of its own for a sandboxed preview frame (FRAMED_CSP)."""
    return Response(
        html,
        content_type="text/html; charset=utf-8",
        headers={"Content-Security-Policy": FRAMED_CSP},
    )


@blueprint.app_template_global("preview_widths")
def preview_widths() -> tuple[tuple[str, int], ...]:
    return PREVIEW_WIDTHS


@blueprint.app_template_filter("when")
def when(value: datetime | str | None) -> str:
    """A time as the console shows it, in UTC, to the second: every time on every page goes
    through here, a stored ISO text (an event's `next_attempt_at`) as well as a datetime."""
    if value is None:
        return ""
    if isinstance(value, str):
        try:
            at = datetime.fromisoformat(value)
        except ValueError:  # not a time after all: shown as it is
            return value
    else:
        at = value
    if at.tzinfo is not None:
        at = at.astimezone(UTC)
    return at.strftime("%Y-%m-%d %H:%M:%S UTC")


async def page(name: str, /, *, status: int = 200, **context: Any) -> Response:
    """Render a page with what every page needs (the user, the navigation, htmx's path)."""
    principal: Principal | None = g.get("principal")
    frame: dict[str, Any] = {"principal": principal, "htmx": HTMX, "path": request.path}
    if principal is not None:
        frame["frame"] = await _frame(principal)
    body = await render_template(f"console/{name}", **frame, **context)
    return Response(body, status=status, content_type="text/html; charset=utf-8")


@dataclass(frozen=True, slots=True)
class Frame:
    """What the frame of every page shows: the user's workspaces, and the sandbox mode."""

    workspaces: list[WorkspaceView]
    sandboxed: bool


async def _frame(principal: Principal) -> Frame:
    found = await workspaces.workspaces_of(rt(), principal)
    current = [v for v in found if v.workspace.id == principal.workspace_id]
    return Frame(found, bool(current) and current[0].sandboxed)


async def form() -> dict[str, str]:
    """The posted form, each field's last value (checkboxes: present means on)."""
    data = await request.form
    return {key: data.getlist(key)[-1] for key in data}


def parse(model: type[M], data: Mapping[str, Any]) -> tuple[M | None, dict[str, str]]:
    """The form as `model` (the API's request model, so the same rules apply), or the
    message for each field that failed."""
    try:
        return model.model_validate(dict(data)), {}
    except pydantic.ValidationError as exc:
        problems: dict[str, str] = {}
        for error in exc.errors():
            field = str(error["loc"][0]) if error["loc"] else "form"
            problems.setdefault(field, problem_message(error, model))
        return None, problems


def problems_of(exc: EngineError) -> dict[str, str]:
    """An engine refusal as messages per field (`form` for the whole form)."""
    found: dict[str, str] = {}
    for item in exc.extra.get("errors", []) or []:
        loc = [part for part in item.get("loc", []) if part not in ("body", "query")]
        found.setdefault(str(loc[0]) if loc else "form", str(item.get("msg", exc.detail)))
    found.setdefault("form", exc.detail)
    return found


@blueprint.errorhandler(EngineError)
async def refused(exc: EngineError) -> Response:
    """What a page could not do, said on a page (forms catch their own errors first)."""
    status = status_of(exc)
    if status == 401:
        return go("console.auth.login")
    return await page("error.html", status=status, detail=exc.detail, code=exc.code)


@blueprint.get("/favicon.ico")
@public
async def favicon() -> Response:
    return Response(FAVICON, content_type="image/svg+xml", headers={"Cache-Control": FAVICON_CACHE})


@blueprint.app_errorhandler(NoRoute)
async def no_such_page(exc: NoRoute) -> Response:
    """An address nothing serves: the console's 404 page for a browser, the API's error body
    for anything else (and always under `/v1/`)."""
    wants_page = request.accept_mimetypes.best_match(["application/json", "text/html"])
    if request.path.startswith("/v1/") or wants_page != "text/html":
        return error_response(404, http_error_code(404), exc.description or exc.name)
    response = await page(
        "error.html",
        status=404,
        title="Page not found",
        detail=f"Nothing is at {request.path}: it may have moved, or the link is mistyped.",
        code="not_found",
    )
    return await security_headers(response)
