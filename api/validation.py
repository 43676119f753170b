"""Request parsing: JSON bodies and query strings into pydantic models, or a 422.

Bodies are parsed straight from bytes by pydantic (one pass in Rust). The models are also
registered with quart-schema, so `/openapi.json` documents exactly what is enforced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar

import pydantic
from quart import Quart, Response, current_app, g, request
from quart_schema import document_querystring, document_request
from werkzeug.exceptions import RequestEntityTooLarge, UnsupportedMediaType

from engine.errors import Unprocessable

M = TypeVar("M", bound=pydantic.BaseModel)
Handler = Callable[..., Awaitable[Any]]


def _location(loc: tuple[int | str, ...], source: str) -> list[int | str]:
    return [source, *loc]


def validation_error(exc: pydantic.ValidationError, source: str) -> Unprocessable:
    """The 422 for a pydantic error, with one `{loc, msg}` per problem."""
    errors = [{"loc": _location(e["loc"], source), "msg": e["msg"]} for e in exc.errors()]
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"])
    return Unprocessable(f"{where}: {first['msg']}", errors=errors)


def _nul_refused(source: str) -> Unprocessable:
    # PostgreSQL cannot store NUL in text, and no field of ours has a use for one.
    return Unprocessable(
        "NUL characters are not allowed", errors=[{"loc": [source], "msg": "contains NUL"}]
    )


def parse_body(model: type[M], raw: str | bytes) -> M:
    """Validate a JSON body; Unprocessable when it is not JSON or not the model."""
    if not raw.strip():
        raise Unprocessable(
            "a JSON body is required", errors=[{"loc": ["body"], "msg": "body is empty"}]
        )
    if isinstance(raw, str):
        raw = raw.encode()
    if b"\x00" in raw or b"\\u0000" in raw:
        raise _nul_refused("body")
    try:
        return model.model_validate_json(raw)
    except pydantic.ValidationError as exc:
        raise validation_error(exc, "body") from None


def _require_json_content_type() -> None:
    # A body declared as something else (a form, plain text) was not meant for this API;
    # a body with no declared type is read as JSON.
    mimetype = request.mimetype
    if mimetype and mimetype != "application/json" and not mimetype.endswith("+json"):
        raise UnsupportedMediaType(f"send the body as application/json, not {mimetype}")


def json_body(model: type[M]) -> Callable[[Handler], Handler]:
    """Decorator: the handler receives the parsed body as `body`."""

    def decorate(handler: Handler) -> Handler:
        @wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            _require_json_content_type()
            raw = await request.get_data(cache=False, as_text=False)
            g.body_read = True
            return await handler(*args, body=parse_body(model, raw), **kwargs)

        return document_request(model)(wrapper)

    return decorate


def query_args(model: type[M]) -> Callable[[Handler], Handler]:
    """Decorator: the handler receives the parsed query string as `query`."""

    def decorate(handler: Handler) -> Handler:
        @wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            repeated = sorted({key for key, values in request.args.lists() if len(values) > 1})
            if repeated:
                # Which of several values counts would be a guess; refuse instead.
                raise Unprocessable(
                    f"query parameter {repeated[0]!r} is given more than once",
                    errors=[
                        {"loc": ["query", key], "msg": "given more than once"} for key in repeated
                    ],
                )
            given = request.args.to_dict()
            if any("\x00" in key or "\x00" in value for key, value in given.items()):
                raise _nul_refused("query")
            try:
                query = model.model_validate(given)
            except pydantic.ValidationError as exc:
                raise validation_error(exc, "query") from None
            return await handler(*args, query=query, **kwargs)

        return document_querystring(model)(wrapper)

    return decorate


def _declares_body() -> bool:
    length = request.content_length
    return bool(length) or "chunked" in request.headers.get("Transfer-Encoding", "").lower()


def install(app: Quart) -> None:
    """Refuse oversized bodies on every route; close connections whose request body went unread.

    A refusal (401, 403, 404, 405, 413, 415) can be sent before the body has arrived. The
    HTTP server then neither drains the rest of the body nor closes the connection, so the
    client's next request on it would never be answered; `Connection: close` makes the
    client open a fresh connection instead.
    """

    @app.before_request
    async def refuse_oversized_body() -> None:
        # Quart checks the size only when a route reads the body; refuse it on every route.
        limit = current_app.config["MAX_CONTENT_LENGTH"]
        if request.content_length is not None and request.content_length > limit:
            raise RequestEntityTooLarge()

    @app.after_request
    async def close_if_body_unread(response: Response) -> Response:
        if _declares_body() and not g.get("body_read", False):
            response.headers["Connection"] = "close"
        return response
