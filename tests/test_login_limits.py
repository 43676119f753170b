"""Password guessing is limited per account and per client address, and cannot stall the API.

Attacks replayed against the real service: repeated wrong passwords on one account, an
unknown account probed the same way, one address spraying many accounts (with forged
X-Forwarded-For headers), re-authentication guessing, guessing split over two nodes sharing
one database, and a flood of concurrent logins while an API-key client reads.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import trio
from trio.testing import MockClock

from engine.accounts import login_limits
from postroom.service import serve
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.service import PUBLIC_URL, Service

COOKIE = "postroom_session"
ACCOUNT_LIMIT = login_limits.ACCOUNT.attempts
ADDRESS_LIMIT = login_limits.ADDRESS.attempts
ACCOUNT_WINDOW = int(login_limits.ACCOUNT.window.total_seconds())
ADDRESS_WINDOW = int(login_limits.ADDRESS.window.total_seconds())
WRONG = "not the password"


def client_from(service: Service, address: str) -> httpx.AsyncClient:
    """A client whose connections come from `address` (any 127.x.y.z is loopback)."""
    transport = httpx.AsyncHTTPTransport(
        local_address=address, limits=httpx.Limits(max_keepalive_connections=0)
    )
    return service.client(transport=transport)


async def login(client: httpx.AsyncClient, email: str, password: str) -> httpx.Response:
    return await client.post("/v1/auth/login", json={"email": email, "password": password})


def assert_limited(response: httpx.Response, longest: int) -> int:
    """A 429 `rate_limited` whose Retry-After is a whole number of seconds, at most `longest`."""
    assert response.status_code == 429, response.text
    body = response.json()
    assert body["code"] == "rate_limited"
    assert isinstance(body["detail"], str)
    retry_after = int(response.headers["Retry-After"])
    assert 0 < retry_after <= longest
    return retry_after


async def test_wrong_passwords_lock_the_account_until_the_window_ends(
    service: Service, clock: MockClock
) -> None:
    account = await service.account()
    client = service.client()

    for _ in range(ACCOUNT_LIMIT):
        assert (await login(client, account.email, WRONG)).status_code == 401
    retry_after = assert_limited(await login(client, account.email, WRONG), ACCOUNT_WINDOW)
    # While locked, even the right password is refused, and costs the guesser nothing.
    assert_limited(await login(client, account.email, account.password), ACCOUNT_WINDOW)

    service.clock.jump(retry_after + 1)
    response = await login(client, account.email, account.password)
    assert response.status_code == 200, response.text
    assert response.cookies[COOKIE]


async def test_a_successful_login_forgives_the_accounts_failures(service: Service) -> None:
    account = await service.account()
    client = service.client()
    for _ in range(ACCOUNT_LIMIT - 1):
        assert (await login(client, account.email, WRONG)).status_code == 401

    assert (await login(client, account.email, account.password)).status_code == 200

    # Without the reset the first of these would be the 11th counted attempt.
    for _ in range(2):
        assert (await login(client, account.email, WRONG)).status_code == 401


async def test_an_unknown_account_is_answered_and_limited_like_a_known_one(
    service: Service, clock: MockClock
) -> None:
    account = await service.account()
    unknown = "nobody-here@example.org"
    client = service.client()
    # Time stands still, so both windows report the very same Retry-After.
    clock.rate = 0
    try:
        for attempt in range(ACCOUNT_LIMIT + 2):
            known = await login(client, account.email, WRONG)
            missing = await login(client, unknown, WRONG)

            assert known.status_code == missing.status_code
            assert known.json() == missing.json()
            assert known.headers.get("Retry-After") == missing.headers.get("Retry-After")
            assert known.status_code == (401 if attempt < ACCOUNT_LIMIT else 429)
    finally:
        clock.rate = 1


async def test_the_address_limit_spans_accounts_and_ignores_forwarded_for(
    service: Service,
) -> None:
    account = await service.account()
    sprayer = client_from(service, "127.0.0.2")

    for n in range(ADDRESS_LIMIT):
        forged = {"X-Forwarded-For": f"203.0.113.{n}"}
        response = await sprayer.post(
            "/v1/auth/login",
            json={"email": f"target-{n}@example.org", "password": WRONG},
            headers=forged,
        )
        assert response.status_code == 401, response.text

    # A further account, the right password, a fresh forged header: the address is spent.
    refused = await sprayer.post(
        "/v1/auth/login",
        json={"email": account.email, "password": account.password},
        headers={"X-Forwarded-For": "198.51.100.7"},
    )
    assert_limited(refused, ADDRESS_WINDOW)
    # Another address is not affected.
    other = await login(client_from(service, "127.0.0.3"), account.email, account.password)
    assert other.status_code == 200, other.text


async def test_reauth_guesses_are_limited_with_the_accounts_logins(service: Service) -> None:
    account = await service.account()
    token = (await login(service.client(), account.email, account.password)).cookies[COOKIE]
    session = service.client(headers={"Cookie": f"{COOKIE}={token}", "Origin": PUBLIC_URL})

    for _ in range(ACCOUNT_LIMIT):
        response = await session.post("/v1/auth/reauth", json={"password": WRONG})
        assert response.status_code == 401, response.text
    refused = await session.post("/v1/auth/reauth", json={"password": account.password})

    assert_limited(refused, ACCOUNT_WINDOW)
    assert_limited(await login(service.client(), account.email, account.password), ACCOUNT_WINDOW)


async def test_the_limit_holds_across_two_services_sharing_one_database(
    service: Service, nursery: trio.Nursery, database_url: str, dns_server: DnsServer
) -> None:
    account = await service.account()
    settings = harness.test_settings(database_url, dns_server)
    other_node = await nursery.start(serve, settings)
    try:
        async with httpx.AsyncClient(base_url=other_node.api_url, timeout=30) as other:
            first = service.client()
            for n in range(ACCOUNT_LIMIT):
                response = await login(first if n % 2 else other, account.email, WRONG)
                assert response.status_code == 401, response.text

            assert_limited(await login(first, account.email, account.password), ACCOUNT_WINDOW)
            assert_limited(await login(other, account.email, account.password), ACCOUNT_WINDOW)
    finally:
        other_node.stop()


async def send_wrong_login(service: Service, n: int, sent: trio.Event) -> int:
    """A wrong-password login over a bare socket, so the test's own client costs next to
    nothing; sets `sent` once the request is written; the response's status."""
    body = json.dumps({"email": f"flood-{n}@example.org", "password": WRONG}).encode()
    head = (
        "POST /v1/auth/login HTTP/1.1\r\nHost: postroom.test\r\nConnection: close\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    host, port = urlsplit(service.url).netloc.split(":")
    async with await trio.open_tcp_stream(host, int(port)) as stream:
        await stream.send_all(head.encode() + body)
        sent.set()
        response = b""
        while b"\r\n" not in response:
            chunk = await stream.receive_some()
            assert chunk, "the connection closed without an answer"
            response += chunk
    return int(response.split(b" ", 2)[1])  # the status line is all this client waits for


def resident_mib() -> float:
    """This process's resident memory (the service under test runs in it)."""
    status = Path("/proc/self/status").read_text()
    line = next(line for line in status.splitlines() if line.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


async def test_api_key_reads_stay_fast_while_80_wrong_logins_are_in_flight(
    service: Service,
) -> None:
    account = await service.account()
    await account.client.get("/v1/api-keys/")  # the key is cached; each read is one query
    sent = [trio.Event() for _ in range(80)]
    statuses: list[int] = []
    read_seconds: list[float] = []
    resident_before = peak_resident = resident_mib()

    async def wrong_login(n: int) -> None:
        statuses.append(await send_wrong_login(service, n, sent[n]))

    async with trio.open_nursery() as nursery:
        for n in range(80):
            nursery.start_soon(wrong_login, n)
        for event in sent:
            await event.wait()
        while len(statuses) < 80:
            started = time.perf_counter()
            response = await account.client.get("/v1/api-keys/")
            read_seconds.append(time.perf_counter() - started)
            peak_resident = max(peak_resident, resident_mib())
            assert response.status_code == 200

    # Before the password threads a read took 9.8 s: every database call queued behind
    # argon2 on the same threads. (The bound leaves room for a suite loading both cores.)
    assert max(read_seconds) < 3.0, read_seconds
    assert len(read_seconds) >= 3  # the reads did overlap the logins
    # Argon2 takes 64 MiB a call: only a few run at once (it was 2 GB, 40 at a time).
    assert peak_resident - resident_before < 512
    # Beyond the small queue for the password threads, logins are refused at once.
    assert set(statuses) == {401, 429}


def test_ipv6_clients_are_counted_per_64_block() -> None:
    one = login_limits.attempt("a@example.org", "2001:db8:1:2::1")
    same_block = login_limits.attempt("a@example.org", "2001:db8:1:2:ffff::9")
    next_block = login_limits.attempt("a@example.org", "2001:db8:1:3::1")
    mapped = login_limits.attempt("a@example.org", "::ffff:192.0.2.1")

    assert one == same_block
    assert one.address != next_block.address
    assert mapped.address == login_limits.attempt("a@example.org", "192.0.2.1").address
