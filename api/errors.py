"""The error body of every 4xx and 5xx: `{"code", "detail"}` plus extra keys where useful.

Engine errors map to statuses by type; HTTP errors raised by Quart (unknown route, wrong
method, body too large) get the same body, so no client ever sees an HTML error page. A
database with no room left is 507 `storage_full` with `Retry-After`: nothing was stored, and
the same request can succeed once space returns. A database that cannot be reached is 503
`database_unavailable` with `Retry-After`, answered at once while storage knows it is gone.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from quart import Quart, Response, jsonify
from werkzeug.exceptions import HTTPException

from engine.platform.errors import (
    Conflict,
    EngineError,
    Forbidden,
    Gone,
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    StorageFull,
    Unauthorized,
    Unprocessable,
)
from storage.errors import DatabaseUnreachable, is_outage

log = logging.getLogger("postroom.api")

STORAGE_FULL_RETRY_AFTER = 60  # seconds: an operator has to free space, this is no blip
DATABASE_RETRY_AFTER = 5  # seconds: a dropped connection or a restarting server

_STATUS_OF = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),
    (InvalidRequest, 400),
    (PayloadTooLarge, 413),
    (Unprocessable, 422),
    (Gone, 410),
    (RateLimited, 429),
)

_CODE_OF_HTTP_STATUS = {
    400: "bad_request",
    404: "not_found",
    405: "method_not_allowed",
    413: "payload_too_large",
    415: "unsupported_media_type",
}


def status_of(exc: EngineError) -> int:
    """The HTTP status of an engine error (400 for kinds without one of their own); the
    console and the MCP door answer with it too."""
    return next((s for kind, s in _STATUS_OF if isinstance(exc, kind)), 400)


def http_error_code(status: int) -> str:
    """The `code` of a refusal by the HTTP layer (unknown route, wrong method, body too large)."""
    return _CODE_OF_HTTP_STATUS.get(status, "http_error")


@dataclass(frozen=True, slots=True)
class ErrorAnswer:
    """An error response, before any framework makes it one: status, body and headers."""

    status: int
    body: dict[str, Any]
    headers: dict[str, str] = field(default_factory=dict)


def _answer(status: int, code: str, detail: str, /, **extra: Any) -> ErrorAnswer:
    headers = {"WWW-Authenticate": 'Bearer realm="postroom"'} if status == 401 else {}
    return ErrorAnswer(status, {"code": code, "detail": detail, **extra}, headers)


def answer_of(exc: Exception) -> ErrorAnswer:
    """The response to a request that raised `exc`: the one rule for Quart's error handlers
    and the send door at the ASGI edge (api/send_edge.py). An error that is no refusal is
    logged: an outage briefly, anything else with its traceback."""
    if isinstance(exc, StorageFull):
        answer = _answer(
            507,
            "storage_full",
            "the service has no storage space left; nothing was stored, try again later",
        )
        answer.headers["Retry-After"] = str(STORAGE_FULL_RETRY_AFTER)
    elif isinstance(exc, EngineError):
        answer = _answer(status_of(exc), exc.code, exc.detail, **exc.extra)
        if isinstance(exc, RateLimited):
            answer.headers["Retry-After"] = str(exc.retry_after)
    elif isinstance(exc, HTTPException):
        status = exc.code or 500
        answer = _answer(status, http_error_code(status), exc.description or exc.name)
    elif is_outage(exc):  # not a bug of ours: the client may try again shortly
        if not isinstance(exc, DatabaseUnreachable):  # that one storage logs once, not per call
            log.error("database unavailable: %s", exc)
        answer = _answer(
            503, "database_unavailable", "the database is unavailable; try again shortly"
        )
        answer.headers["Retry-After"] = str(DATABASE_RETRY_AFTER)
    else:
        log.error("unhandled error", exc_info=exc)
        answer = _answer(500, "internal_error", "internal error; it has been logged")
    return answer


def _response(answer: ErrorAnswer) -> Response:
    response = jsonify(answer.body)
    response.status_code = answer.status
    response.headers.update(answer.headers)
    return response


def error_response(status: int, code: str, detail: str, /, **extra: Any) -> Response:
    """A JSON error response with the standard body (`extra` may even hold a `status` key)."""
    return _response(_answer(status, code, detail, **extra))


def install(app: Quart) -> None:
    """Register the handler that gives every error the standard body (`answer_of`)."""

    @app.errorhandler(Exception)
    async def any_error(exc: Exception) -> Response:
        return _response(answer_of(exc))
