"""Request parsing: JSON bodies and query strings into pydantic models, or a 422.

Bodies are parsed straight from bytes by pydantic (one pass in Rust). The models are also
registered with quart-schema, so `/openapi.json` documents exactly what is enforced.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from functools import wraps
from typing import Any, TypeVar

import pydantic
from quart import request
from quart_schema import document_querystring, document_request

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


def json_body(model: type[M]) -> Callable[[Handler], Handler]:
    """Decorator: the handler receives the parsed body as `body`."""

    def decorate(handler: Handler) -> Handler:
        @wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
            raw = await request.get_data(cache=False, as_text=False)
            return await handler(*args, body=parse_body(model, raw), **kwargs)

        return document_request(model)(wrapper)

    return decorate


def query_args(model: type[M]) -> Callable[[Handler], Handler]:
    """Decorator: the handler receives the parsed query string as `query`."""

    def decorate(handler: Handler) -> Handler:
        @wraps(handler)
        async def wrapper(*args: Any, **kwargs: Any) -> Any:
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
