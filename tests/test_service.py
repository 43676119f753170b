"""The service's own endpoints: health, metrics and the OpenAPI description."""

from __future__ import annotations

import trio

from postroom.service import RunningService, serve
from tests.harness import service as harness
from tests.harness.service import Service


async def test_healthz_answers_without_authentication(service: Service) -> None:
    response = await service.client().get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_metrics_report_database_batches_and_actors(service: Service) -> None:
    account = await service.account()
    await account.client.post("/v1/api-keys/", json={"name": "metered"})
    text = (await service.client().get("/metrics")).text
    writes = next(
        line for line in text.splitlines() if line.startswith("postroom_db_write_units_total ")
    )
    assert float(writes.split()[1]) >= 2  # the account, then the key
    assert "postroom_domain_checker_rounds" in text


async def test_openapi_describes_the_api(service: Service) -> None:
    spec = (await service.client().get("/openapi.json")).json()
    paths = spec["paths"]
    for path in ("/v1/api-keys/", "/v1/domains/", "/v1/senders/", "/v1/suppressions/"):
        assert path in paths
    assert "/v1/audit-log" in paths
    create_key = paths["/v1/api-keys/"]["post"]
    assert "201" in create_key["responses"]
    assert create_key["requestBody"]["content"]["application/json"]["schema"]


async def test_an_idle_keep_alive_connection_does_not_delay_a_clean_stop(
    database_url: str,
) -> None:
    # A client (a load balancer, a browser) keeps its connection open after its answer; a
    # stop must close it at once, not wait out the HTTP server's grace period for it.
    async with trio.open_nursery() as nursery:
        running: RunningService = await nursery.start(serve, harness.test_settings(database_url))
        host, port = running.api_url.removeprefix("http://").rsplit(":", 1)
        idle = await trio.open_tcp_stream(host, int(port))
        await idle.send_all(b"GET /healthz HTTP/1.1\r\nHost: postroom\r\n\r\n")
        answer = b""
        while not answer.endswith(b'{"status":"ok"}'):
            answer += await idle.receive_some(4096)
        assert answer.startswith(b"HTTP/1.1 200")
        began = trio.current_time()
        running.stop()
    assert trio.current_time() - began < 3
    assert await idle.receive_some(4096) == b""  # closed by the server
    await idle.aclose()
