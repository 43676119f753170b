"""engine/platform/http1_client.py against the harness's HTTPS receiver on loopback.

Keep-alive within the per-origin bound, TLS verification, the caller's connect rule, a peer
that closes an idle connection, and answers that are not 2xx or never come.
"""

from __future__ import annotations

import ssl
from functools import partial

import pytest
import trio

from engine.platform.http1_client import Client, HttpError
from tests.harness.https_receiver import HttpReply, HttpsReceiver
from tests.harness.peer import HOST
from tests.harness.tls import TlsAuthority

HEADERS = {"Content-Type": "application/json"}


async def _connect(host: str, port: int) -> trio.SocketStream:
    return await trio.open_tcp_stream(host, port)


async def test_posts_reuse_at_most_per_origin_connections(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    client = Client(tls_ca.client_context(), _connect, per_origin=4)
    statuses: list[int] = []

    async def one(n: int) -> None:
        reply = await client.post(f"{https_receiver.url}/hook?n={n}", b'{"n": 1}', HEADERS)
        statuses.append(reply.status)

    async with trio.open_nursery() as nursery:
        for n in range(40):
            nursery.start_soon(one, n)
    await client.aclose()
    assert statuses == [200] * 40
    assert len(https_receiver.requests) == 40
    assert https_receiver.connections <= 4
    request = https_receiver.requests[0]
    assert request.method == "POST"
    assert request.path.startswith("/hook?n=")
    assert request.body == b'{"n": 1}'
    assert request.headers["content-type"] == "application/json"


async def test_a_certificate_the_context_does_not_trust_is_refused(
    https_receiver: HttpsReceiver,
) -> None:
    client = Client(ssl.create_default_context(), _connect)
    with pytest.raises(HttpError) as raised:
        await client.post(https_receiver.url + "/hook", b"{}", HEADERS)
    chain, seen = [], raised.value.__cause__
    while seen is not None:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    assert any(isinstance(e, ssl.SSLCertVerificationError) for e in chain)
    assert https_receiver.requests == []


async def test_the_connect_rule_decides_what_is_reached(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    async def refuse(host: str, port: int) -> trio.SocketStream:
        raise HttpError(f"refused to connect: {host} is private")

    client = Client(tls_ca.client_context(), refuse)
    with pytest.raises(HttpError, match="refused to connect"):
        await client.post(https_receiver.url + "/hook", b"{}", HEADERS)
    assert https_receiver.requests == []


async def test_a_connection_the_peer_closed_while_idle_is_replaced(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    client = Client(tls_ca.client_context(), _connect, per_origin=1)
    # The receiver answers, then closes: the kept connection is dead before the next POST.
    https_receiver.respond_sequence([HttpReply(200, b"{}", headers=(("connection", "close"),))])
    first = await client.post(https_receiver.url + "/hook", b"1", HEADERS)
    second = await client.post(https_receiver.url + "/hook", b"2", HEADERS)
    await client.aclose()
    assert (first.status, second.status) == (200, 200)
    assert [r.body for r in https_receiver.requests] == [b"1", b"2"]
    assert https_receiver.connections == 2


async def test_an_error_answer_is_an_answer_with_its_text(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    client = Client(tls_ca.client_context(), _connect)
    https_receiver.respond(503, "down for maintenance")
    reply = await client.post(https_receiver.url + "/hook", b"{}", HEADERS)
    await client.aclose()
    assert (reply.status, reply.text) == (503, "down for maintenance")


@pytest.mark.parametrize("url", ["https://", "ftp://example.org/", "https://exa mple.org/"])
async def test_a_url_that_cannot_be_sent_to_is_an_http_error(
    url: str, tls_ca: TlsAuthority
) -> None:
    client = Client(tls_ca.client_context(), _connect)
    with pytest.raises(HttpError):
        await client.post(url, b"{}", HEADERS)


async def test_a_peer_that_hangs_up_without_answering_is_an_http_error(
    nursery: trio.Nursery, tls_ca: TlsAuthority
) -> None:
    async def hang_up(stream: trio.SSLStream[trio.SocketStream]) -> None:
        await stream.receive_some(65536)
        await stream.aclose()

    serve = partial(trio.serve_ssl_over_tcp, hang_up, 0, tls_ca.server_context(), host=HOST)
    listeners = await nursery.start(serve)
    port = listeners[0].transport_listener.socket.getsockname()[1]
    client = Client(tls_ca.client_context(), _connect)
    with pytest.raises(HttpError, match="without answering"):
        await client.post(f"https://{HOST}:{port}/hook", b"{}", HEADERS)
