"""The API's lean HTTP edges: the body guard at the ASGI edge and the cached response converter.

The guard is driven with ASGI messages as hypercorn sends them, around a small ASGI app that
answers either before reading the body (a refusal) or after it; the converter is checked
against quart-schema's own, byte for byte, on what routes return.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest
from quart import Quart, Response
from quart_schema import QuartSchema
from quart_trio import QuartTrio

from api import responses
from api.validation import body_guard

LIMIT = 1000


def _scope(headers: list[tuple[bytes, bytes]]) -> dict[str, Any]:
    return {"type": "http", "method": "POST", "path": "/v1/x", "headers": headers}


async def _drive(
    inner: Any, headers: list[tuple[bytes, bytes]], chunks: list[bytes]
) -> list[dict[str, Any]]:
    """Run the guarded app with the body in `chunks`; what it sent."""
    queue = [
        {"type": "http.request", "body": chunk, "more_body": i < len(chunks) - 1}
        for i, chunk in enumerate(chunks)
    ]
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return queue.pop(0)

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await body_guard(inner, LIMIT)(_scope(headers), receive, send)
    return sent


def _answer_first(read_body: bool) -> Any:
    async def inner(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if read_body:
            while (await receive()).get("more_body", False):
                pass
        await send({"type": "http.response.start", "status": 401, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    return inner


async def test_declared_body_over_the_limit_is_refused_before_any_route() -> None:
    sent = await _drive(_answer_first(True), [(b"content-length", b"1001")], [b""])
    assert sent[0]["status"] == 413
    assert (b"connection", b"close") in sent[0]["headers"]
    body = json.loads(sent[1]["body"])
    assert body["code"] == "payload_too_large"
    assert body["detail"]


async def test_answer_before_the_body_arrived_closes_the_connection() -> None:
    headers = [(b"content-length", b"10")]
    sent = await _drive(_answer_first(False), headers, [b"12345", b"67890"])
    assert sent[0]["status"] == 401
    assert (b"connection", b"close") in sent[0]["headers"]


@pytest.mark.parametrize(
    "headers", [[(b"content-length", b"10")], [(b"transfer-encoding", b"chunked")]]
)
async def test_answer_after_the_whole_body_keeps_the_connection(
    headers: list[tuple[bytes, bytes]],
) -> None:
    sent = await _drive(_answer_first(True), headers, [b"12345", b"67890"])
    assert sent[0]["status"] == 401
    assert (b"connection", b"close") not in sent[0]["headers"]


async def test_request_without_a_body_passes_untouched() -> None:
    sent = await _drive(_answer_first(False), [(b"content-length", b"0")], [b""])
    assert sent[0]["headers"] == []


def _app(cached: bool) -> Quart:
    app = QuartTrio(__name__)
    QuartSchema(app)
    if cached:
        responses.install(app)
    return app


@pytest.mark.parametrize(
    "result",
    [
        {"id": "a", "at": datetime(2026, 11, 23, 20, 0, tzinfo=UTC), "n": [1, 2]},
        ({"id": "a"}, 201),
        [{"id": "a"}, {"id": "b"}],
        ({"id": "a"}, 202, {"Location": "/v1/x/a"}),
        ("plain text", 200),
    ],
)
async def test_cached_converter_sends_what_quart_schema_sends(result: Any) -> None:
    answers = []
    for cached in (False, True):
        app = _app(cached)
        async with app.test_request_context("/"):
            response = await app.make_response(result)
            assert isinstance(response, Response)
            body = await response.get_data()
            answers.append((response.status_code, dict(response.headers), body))
    assert answers[0] == answers[1]
