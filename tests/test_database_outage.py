"""The database server crashes under the service and comes back, twice (issue 29).

The service runs on a PostgreSQL server of the test's own (tests/harness/postgres_server.py),
crashed with `pg_ctl stop -m immediate` and started again. Asserted, as an operator sees it:
- while the database is gone, the API answers 503 `database_unavailable` with Retry-After in
  well under a second (not after the pool's time-out), and the SMTP relay 451 4.3.0;
- the service comes back by itself when the database does, as the same processes;
- a second outage, however long after the first, is waited out like the first (the grace
  before the service stops counts from the latest time the database answered);
- nothing accepted is lost, and every node stays alive: an outage is not a node death.
"""

from __future__ import annotations

import secrets
import smtplib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import trio.testing

from postroom.service import RunningService, serve
from tests.harness.dns_server import DnsServer
from tests.harness.postgres_server import PostgresServer, own_postgres_server
from tests.harness.service import Service
from tests.harness.service import test_settings as settings_for
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority
from tests.test_sending import message, ready_account, route_mail

FAST = 0.5  # seconds: the slowest answer allowed once the service knows the database is gone
KNOWN_WITHIN = 2.0  # seconds after the crash by which every answer must be fast


@pytest.fixture(scope="module")
def postgres_server() -> Iterator[PostgresServer]:
    with own_postgres_server() as server:
        yield server


@pytest.fixture
async def service_on_own_postgres(
    nursery: trio.Nursery,
    postgres_server: PostgresServer,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
    tmp_path: Path,
) -> AsyncIterator[Service]:
    """The whole service in this process, on a fresh database of the test's own server."""
    url = await trio.to_thread.run_sync(
        postgres_server.new_database, "outage_" + secrets.token_hex(4)
    )
    relay_pem = tmp_path / "relay.pem"
    tls_ca.server_cert.private_key_and_cert_chain_pem.write_to_path(str(relay_pem))
    settings = settings_for(
        url,
        dns_server,
        delivery_port=str(smtp_sink.port),
        tls_cert=str(relay_pem),
        tls_key=str(relay_pem),
        secret_key_file=str(tmp_path / "secret.key"),
    )
    running: RunningService = await nursery.start(serve, settings)
    service = Service(running, clock)
    try:
        yield service
    finally:
        await service.aclose()
        running.stop()


async def _timed(call: Any) -> tuple[float, httpx.Response]:
    began = time.monotonic()
    response = await call()
    return time.monotonic() - began, response


async def _answers_during_outage(
    client: httpx.AsyncClient, body: dict[str, Any]
) -> list[tuple[float, float, int]]:
    """(seconds since the crash, answer time, status) of sends and lists for 3 s."""
    crashed = time.monotonic()
    seen: list[tuple[float, float, int]] = []
    while time.monotonic() - crashed < 3.0:
        for call in (
            lambda: client.get("/v1/emails/"),
            lambda: client.post("/v1/emails/", json=body),
        ):
            took, response = await _timed(call)
            seen.append((time.monotonic() - crashed, took, response.status_code))
            if time.monotonic() - crashed > KNOWN_WITHIN:
                assert response.status_code == 503, response.text
                assert response.json()["code"] == "database_unavailable"
                assert response.headers["Retry-After"].isdigit()
        await trio.sleep(0.05)
    return seen


def _relay_answer(service: Service, tls_ca: TlsAuthority) -> tuple[int, bytes | str]:
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=10) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        try:
            smtp.login("someone@example.org", "a password")
        except smtplib.SMTPAuthenticationError as refused:
            return refused.smtp_code, refused.smtp_error
    raise AssertionError("logged in while the database was down")


async def _until_healthy(service: Service, timeout: float) -> float:  # noqa: ASYNC109
    began = time.monotonic()
    async with httpx.AsyncClient(base_url=service.url, timeout=5) as client:
        with trio.fail_after(timeout):
            while True:
                if (await client.get("/healthz")).status_code == 200:
                    break
                await trio.sleep(0.1)
    return time.monotonic() - began


async def test_two_outages_in_a_row_answer_fast_and_the_service_comes_back(
    service_on_own_postgres: Service,
    postgres_server: PostgresServer,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
) -> None:
    service = service_on_own_postgres
    account = await ready_account(service, dns_server, plan="business")
    route_mail(dns_server, "outage.example")
    body = message("reader@outage.example")
    sent = await account.client.post("/v1/emails/", json=body)
    assert sent.status_code == 202, sent.text
    await smtp_sink.wait_for_messages(1, timeout=15)

    for outage in (1, 2):
        await trio.to_thread.run_sync(postgres_server.crash)
        seen = await _answers_during_outage(account.client, body)
        known = [took for since, took, _ in seen if since > KNOWN_WITHIN]
        print(
            f"outage {outage}: first answer {seen[0][1]:.2f} s, then at most"
            f" {max(known):.3f} s over {len(known)} requests"
        )
        assert max(known) < FAST
        code, reply = await trio.to_thread.run_sync(_relay_answer, service, tls_ca)
        text = reply.decode() if isinstance(reply, bytes) else reply
        assert code == 451 and text.startswith("4.3.0"), text

        await trio.to_thread.run_sync(postgres_server.start)
        print(f"outage {outage}: healthy {await _until_healthy(service, 15):.2f} s after restart")
        again = await account.client.post(
            "/v1/emails/", json=message(f"after{outage}@outage.example")
        )
        assert again.status_code == 202, again.text
        await smtp_sink.wait_for_messages(1 + outage, timeout=15)
        # The next outage comes long after this one: the database answered meanwhile, so it
        # is waited out as if it were the first (before, it stopped the service at once).
        clock.jump(120)
