"""Request parsing: JSON bodies and query strings into pydantic models, or a 422.

Bodies are parsed straight from bytes by pydantic (one pass in Rust). The models are also
registered with quart-schema, so `/openapi.json` documents exactly what is enforced. A field
a model does not know is refused (api/models.py `In`), named with the closest known name, in
the API, the console's forms and the MCP door's tool arguments alike. The rules on every
request body (size, closing a connection whose body was cut short) sit at the ASGI edge
(`body_guard`), where they cost no per-request hook.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from functools import wraps
from typing import Any, TypeVar, get_args

import pydantic
from pydantic_core import ErrorDetails
from quart import request
from quart_schema import document_querystring, document_request
from werkzeug.exceptions import RequestEntityTooLarge, UnsupportedMediaType

from api.errors import http_error_code
from engine.platform.errors import Unprocessable, unknown_name

M = TypeVar("M", bound=pydantic.BaseModel)
Handler = Callable[..., Awaitable[Any]]


def _models_in(annotation: Any) -> list[type[pydantic.BaseModel]]:
    """The models an annotation holds (`Address`, `list[Address]`, `Address | None`)."""
    if isinstance(annotation, type) and issubclass(annotation, pydantic.BaseModel):
        return [annotation]
    return [found for arg in get_args(annotation) for found in _models_in(arg)]


def known_fields(model: type[pydantic.BaseModel], path: Sequence[int | str]) -> list[str]:
    """The field names of the object at `path` inside `model` (list indexes skipped)."""
    models = [model]
    for part in path:
        if isinstance(part, int):
            continue
        inner = [m.model_fields[part].annotation for m in models if part in m.model_fields]
        models = [found for annotation in inner for found in _models_in(annotation)]
    return sorted({name for m in models for name in m.model_fields})


def problem_message(error: ErrorDetails, model: type[pydantic.BaseModel] | None) -> str:
    """The message for one pydantic problem; an unknown field is named, with the closest
    known name of the object it was found in."""
    loc = error["loc"]
    if error["type"] == "extra_forbidden" and model is not None and loc:
        return unknown_name("field", str(loc[-1]), known_fields(model, loc[:-1]))
    return error["msg"]


def validation_error(
    exc: pydantic.ValidationError, source: str, model: type[pydantic.BaseModel] | None = None
) -> Unprocessable:
    """The 422 for a pydantic error, with one `{loc, msg}` per problem (`source` first in
    each loc: body, query, arguments)."""
    errors = [{"loc": [source, *e["loc"]], "msg": problem_message(e, model)} for e in exc.errors()]
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
        raise validation_error(exc, "body", model) from None


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
                raise validation_error(exc, "query", model) from None
            return await handler(*args, query=query, **kwargs)

        return document_querystring(model)(wrapper)

    return decorate


ASGIApp = Any  # (scope, receive, send) -> Awaitable[None]


def _declared_length(headers: list[tuple[bytes, bytes]]) -> int | None:
    """The body length a request declares: its Content-Length, -1 when chunked (unknown),
    None when it has no body."""
    for name, value in headers:  # the ASGI server gives names in lower case
        if name == b"content-length":
            return int(value) if value.strip().isdigit() and int(value) else None
        if name == b"transfer-encoding" and b"chunked" in value.lower():
            return -1
    return None


async def _refuse_too_large(send: Any) -> None:
    body = json.dumps(
        {"code": http_error_code(413), "detail": RequestEntityTooLarge.description}
    ).encode()
    headers = [
        (b"content-type", b"application/json"),
        (b"content-length", str(len(body)).encode()),
        (b"connection", b"close"),  # the body is left unread
    ]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def body_guard(app: ASGIApp, limit: int) -> ASGIApp:
    """The ASGI app behind the two rules on request bodies: a declared length over `limit` is
    refused at once (413), whatever the route (Quart checks only when a route reads the
    body); an answer that starts before the body has fully arrived says `Connection: close`.

    A refusal (401, 403, 404, 405, 413, 415) can be sent before the body has arrived. The
    HTTP server then neither drains the rest of the body nor closes the connection, so the
    client's next request on it would never be answered; `Connection: close` makes the
    client open a fresh connection instead. Both are decided here, from the ASGI messages
    (Quart reads every body as it comes, whether the route wants it or not), rather than in
    per-request hooks.
    """

    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        length = _declared_length(scope["headers"]) if scope["type"] == "http" else None
        if length is None:
            await app(scope, receive, send)
            return
        if length > limit:
            await _refuse_too_large(send)
            return
        arrived = False

        async def receive_noting_the_end() -> dict[str, Any]:
            nonlocal arrived
            message: dict[str, Any] = await receive()
            if message["type"] == "http.request" and not message.get("more_body", False):
                arrived = True
            return message

        async def send_closing_if_cut_short(message: dict[str, Any]) -> None:
            if message["type"] == "http.response.start" and not arrived:
                headers = [*message.get("headers", ()), (b"connection", b"close")]
                message = {**message, "headers": headers}
            await send(message)

        await app(scope, receive_noting_the_end, send_closing_if_cut_short)

    return guarded
