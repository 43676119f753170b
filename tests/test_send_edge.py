"""The send door at the ASGI edge (api/send_edge.py): what it takes, and that it answers
byte for byte as the Quart route does.

Over the wire, a body of declared length takes the edge and the same body sent chunked goes
on to Quart (the edge leaves chunked bodies to Quart's size accounting), so each request is
sent both ways to the real service and the two answers are compared: status, every header
but Date and Connection, and the body with the ids the service made masked.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from datetime import timedelta
from typing import Any

import httpx
import trio
from quart_trio import QuartTrio
from trio.testing import MockClock

from api.send_edge import send_edge
from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail
from tests.harness.service import Account, Service

GENERATED = ("id", "message_id")


async def _chunked(body: bytes) -> AsyncIterator[bytes]:
    yield body


async def _both_ways(
    account: Account, body: bytes | tuple[bytes, bytes], headers: dict[str, str], path: str
) -> tuple[httpx.Response, httpx.Response]:
    """The request with a body of declared length, then chunked (a pair: a body for each)."""
    for_edge, for_quart = body if isinstance(body, tuple) else (body, body)
    edge = await account.client.post(path, content=for_edge, headers=headers)
    quart = await account.client.post(path, content=_chunked(for_quart), headers=headers)
    assert "content-length" in edge.request.headers
    assert edge.request.headers.get("transfer-encoding") is None
    assert quart.request.headers["transfer-encoding"] == "chunked"
    return edge, quart


def _comparable(
    response: httpx.Response, swap: tuple[str, str] = ("", "")
) -> tuple[int, list[tuple[str, str]], Any]:
    """Status, headers but Date and Connection, and the body with made ids masked (`swap`: a
    text of this request's body replaced by the other way's). Connection is framing: Quart
    refuses a key before reading the body, and a chunked body left unread ends the
    connection; the edge reads every body first."""
    headers = sorted((k, v) for k, v in response.headers.items() if k not in ("date", "connection"))
    try:
        body = json.loads(response.text.replace(*swap))
    except ValueError:
        return response.status_code, headers, response.content
    if isinstance(body, dict):
        body = {k: "<made>" if k in GENERATED and v else v for k, v in body.items()}
    return response.status_code, headers, body


async def test_the_edge_answers_every_kind_of_send_as_the_quart_route_does(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "dest.example")  # delivered: no bounce suppresses a recipient
    for gone in ("gone-1@blocked.example", "gone-2@blocked.example"):
        await account.client.post("/v1/suppressions/", json={"email": gone})
    ok = json.dumps(message("ann@dest.example")).encode()
    soon = (service.running.runtime.clock.now() + timedelta(hours=2)).isoformat()
    cases: list[tuple[str, Any, dict[str, str], int]] = [
        ("accepted", ok, {}, 202),
        ("accepted, path without the slash", ok, {}, 202),
        ("charset given", ok, {"Content-Type": "application/json; charset=utf-8"}, 202),
        ("scheduled", json.dumps(message("b@dest.example", send_at=soon)).encode(), {}, 202),
        (
            "scheduled too far ahead",
            json.dumps(message("b@dest.example", send_at="2099-01-01T00:00:00Z")).encode(),
            {},
            400,
        ),
        (
            # Each way its own address: a second send within 24 hours is let through once.
            "suppressed",
            tuple(json.dumps(message(f"gone-{n}@blocked.example")).encode() for n in (1, 2)),
            {},
            202,
        ),
        (
            "not a sender",
            json.dumps(
                {**message("c@dest.example"), "from_": {"email": "x@other.example"}}
            ).encode(),
            {},
            422,
        ),
        ("not JSON", b"{", {}, 422),
        ("empty", b"", {}, 422),
        ("NUL", ok.replace(b"ann", b"a\\u0000nn"), {}, 422),
        (
            "too many recipients",
            json.dumps(message([f"r{i}@dest.example" for i in range(51)])).encode(),
            {},
            422,
        ),
        (
            "unknown template",
            json.dumps(
                {**message("d@dest.example"), "template_id": "00000000-0000-4000-8000-000000000000"}
            ).encode(),
            {},
            404,
        ),
        ("another scheme", ok, {"Authorization": "Basic YWJjOmRlZg=="}, 401),
        ("unknown key", ok, {"Authorization": "Bearer pr_live_" + "x" * 40}, 401),
        ("unusable Idempotency-Key", ok, {"Idempotency-Key": "k" * 257}, 422),
        ("form body", b"a=b", {"Content-Type": "application/x-www-form-urlencoded"}, 415),
    ]
    for name, body, headers, status in cases:
        path = "/v1/emails" if "without the slash" in name else "/v1/emails/"
        edge, quart = await _both_ways(account, body, headers, path)
        assert edge.status_code == status, (name, edge.text)
        swap = ("gone-2", "gone-1") if isinstance(body, tuple) else ("", "")
        assert _comparable(edge) == _comparable(quart, swap), name
        if status == 401:
            assert edge.headers["WWW-Authenticate"] == 'Bearer realm="postroom"'


async def test_an_idempotency_key_replays_and_conflicts_alike_on_both_paths(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "dest.example")
    first = json.dumps(message("ann@dest.example")).encode()
    other = json.dumps(message("bob@dest.example")).encode()
    answers = {}
    for way, key in (("edge", "order-1"), ("quart", "order-2")):
        headers = {"Idempotency-Key": key}
        content: Any = first if way == "edge" else _chunked(first)
        made = await account.client.post("/v1/emails/", content=content, headers=headers)
        content = first if way == "edge" else _chunked(first)
        again = await account.client.post("/v1/emails/", content=content, headers=headers)
        content = other if way == "edge" else _chunked(other)
        clash = await account.client.post("/v1/emails/", content=content, headers=headers)
        assert made.status_code == again.status_code == 202
        assert again.json() == made.json()  # the first answer, replayed: one email
        assert clash.status_code == 409
        answers[way] = [_comparable(r) for r in (made, again, clash)]
    assert answers["edge"] == answers["quart"]
    assert len((await account.client.get("/v1/emails/")).json()) == 2  # one per key


async def test_the_edge_takes_the_common_shape_and_leaves_the_rest_to_quart(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    passed_on: list[str] = []

    async def rest_of_the_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        passed_on.append(f"{scope['method']} {scope['path']}")

    app = QuartTrio(__name__)
    app.json.sort_keys = False  # type: ignore[attr-defined]
    edge = send_edge(app, service.running.runtime, rest_of_the_app)
    body = json.dumps(message("ann@dest.example")).encode()
    key = ("authorization", f"Bearer {account.api_key}")

    async def call(method: str, path: str, headers: list[tuple[str, str]]) -> int | None:
        scope = {
            "type": "http",
            "method": method,
            "path": path,
            "headers": [(k.encode(), v.encode()) for k, v in headers],
        }
        sent: list[dict[str, Any]] = []

        async def receive() -> dict[str, Any]:
            return {"type": "http.request", "body": body, "more_body": False}

        async def send(message: dict[str, Any]) -> None:
            sent.append(message)

        await edge(scope, receive, send)
        return sent[0]["status"] if sent else None

    length = ("content-length", str(len(body)))
    assert await call("POST", "/v1/emails/", [key, length]) == 202
    assert (
        await call("POST", "/v1/emails", [length, key, ("content-type", "application/json")]) == 202
    )
    assert passed_on == []
    cookie = ("cookie", "postroom_session=abc")
    for method, path, headers in [
        ("POST", "/v1/emails/", [cookie, length]),  # a browser session: CSRF rules apply
        ("POST", "/v1/emails/", [key]),  # chunked
        ("POST", "/v1/emails/", [key, length, ("content-type", "text/plain")]),
        ("GET", "/v1/emails/", [key]),
        ("POST", "/v1/emails/batch", [key, length]),
        ("POST", "/v1/emails/validate", [key, length]),
    ]:
        assert await call(method, path, headers) is None
    assert passed_on == [
        "POST /v1/emails/",
        "POST /v1/emails/",
        "POST /v1/emails/",
        "GET /v1/emails/",
        "POST /v1/emails/batch",
        "POST /v1/emails/validate",
    ]


async def _cut_short(service: Service, api_key: str, chunked: bool) -> bytes:
    """A send whose body stops arriving halfway: what the service answers once Quart's
    BODY_TIMEOUT has passed."""
    host, _, port = service.url.removeprefix("http://").rpartition(":")
    framing = b"Transfer-Encoding: chunked\r\n" if chunked else b"Content-Length: 100\r\n"
    start = b"64\r\n" if chunked else b""
    stream = await trio.open_tcp_stream(host, int(port))
    async with stream:
        await stream.send_all(
            b"POST /v1/emails/ HTTP/1.1\r\nHost: postroom\r\n"
            + f"Authorization: Bearer {api_key}\r\n".encode()
            + b"Content-Type: application/json\r\n"
            + framing
            + b"\r\n"
            + start
            + b'{"from_": '
        )
        await service.settled()  # the request is read and waiting for the rest of its body
        service.clock.jump(61)
        answer = b""
        with trio.fail_after(10):
            while b"\r\n\r\n" not in answer or not answer.endswith(b"}\n"):
                received = await stream.receive_some()
                if not received:
                    break
                answer += received
    return answer


async def test_a_body_that_stops_arriving_is_answered_408_on_both_paths(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    answers = [await _cut_short(service, account.api_key, chunked) for chunked in (False, True)]
    for answer in answers:
        head, _, body = answer.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 408 "), answer
        assert json.loads(body)["code"] == "http_error"
    assert answers[0].partition(b"\r\n\r\n")[2] == answers[1].partition(b"\r\n\r\n")[2]
