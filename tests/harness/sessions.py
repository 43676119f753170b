"""Password sessions as tests open them: a login, its session cookie, and clients that send
the cookie (with the public URL as Origin where a request must pass the CSRF check)."""

from __future__ import annotations

import httpx

from tests.harness.service import PUBLIC_URL, Account, Service

COOKIE = "postroom_session"
SAME_ORIGIN = {"Origin": PUBLIC_URL}


async def login(service: Service, email: str, password: str) -> httpx.Response:
    client = service.client()
    return await client.post("/v1/auth/login", json={"email": email, "password": password})


async def session_token(service: Service, account: Account) -> str:
    response = await login(service, account.email, account.password)
    assert response.status_code == 200, response.text
    token: str = response.cookies[COOKIE]
    return token


def with_cookie(service: Service, token: str, **headers: str) -> httpx.AsyncClient:
    """A client that sends only the session cookie (no API key), one connection per request.

    Keep-alive connections do not survive a jump of the clock by more than a minute.
    """
    return service.client(
        headers={"Cookie": f"{COOKIE}={token}", **headers},
        limits=httpx.Limits(max_keepalive_connections=0),
    )


async def signed_in_client(service: Service, account: Account) -> httpx.AsyncClient:
    """A client signed in as `account`: its session cookie, and the public URL as Origin."""
    response = await service.client().post(
        "/v1/auth/login", json={"email": account.email, "password": account.password}
    )
    assert response.status_code == 200, response.text
    token = response.cookies["postroom_session"]
    return service.client(headers={"Cookie": f"postroom_session={token}", "Origin": PUBLIC_URL})
