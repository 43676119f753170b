"""What a route returns, made into a response as quart-schema does, without its per-response cost.

quart-schema wraps the app's `make_response` and dumps a returned dict or list through a
pydantic `TypeAdapter` built anew for every response (a schema compiled from the type: about
a tenth of a millisecond, a sixth of a small request's framework time). Routes here return
dicts and lists (optionally with a status), so the adapter of each of those types is built
once; anything else (a Response, text, a header mapping, a model) still goes through
quart-schema's own conversion. The dump itself is unchanged, so the bytes sent are the same.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import TypeAdapter
from quart import Quart

MakeResponse = Callable[[Any], Awaitable[Any]]


def install(app: Quart) -> None:
    """Replace quart-schema's `make_response` wrapper (installed by `QuartSchema(app)`) with
    one that reuses the adapters; a no-op where quart-schema is configured to camelise keys
    or prefer msgspec, which the fast path does not do."""
    schema_make_response: MakeResponse = app.make_response
    quart_make_response: MakeResponse | None = getattr(schema_make_response, "__wrapped__", None)
    if quart_make_response is None:
        raise RuntimeError("quart-schema no longer wraps make_response: revisit api/responses")
    if app.config["QUART_SCHEMA_CONVERT_CASING"] or (
        app.config["QUART_SCHEMA_CONVERSION_PREFERENCE"] == "msgspec"
    ):
        return
    options = app.config["QUART_SCHEMA_PYDANTIC_DUMP_OPTIONS"] or {}
    adapters: dict[type, TypeAdapter[Any]] = {dict: TypeAdapter(dict), list: TypeAdapter(list)}

    async def make_response(result: Any) -> Any:
        rest: tuple[Any, ...] = ()
        value = result
        if type(result) is tuple:
            value, *more = result
            rest = tuple(more)
        adapter = adapters.get(type(value))
        # The fast path: a dict or list, alone or with a status code (not with headers).
        if adapter is None or (rest and (len(rest) > 1 or type(rest[0]) is not int)):
            return await schema_make_response(result)
        dumped = adapter.dump_python(value, **options)
        return await quart_make_response((dumped, *rest) if rest else dumped)

    app.make_response = make_response  # type: ignore[method-assign]
