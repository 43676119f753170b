"""Password sessions: login cookie, CSRF by Origin, workspace selection, logout, expiry, reauth."""

from __future__ import annotations

import base64
import json
import secrets
from datetime import datetime, timedelta
from typing import Any

import jwt
import pytest
import trio
from trio.testing import MockClock

from storage import accounts as account_rows
from storage.accounts import Workspace
from storage.codec import new_id
from tests.harness.api import assert_error
from tests.harness.clock import runtime
from tests.harness.service import Service
from tests.harness.sessions import COOKIE, SAME_ORIGIN, login, session_token, with_cookie


async def test_login_sets_an_http_only_cookie_and_returns_the_user(service: Service) -> None:
    account = await service.account("starter")

    response = await login(service, account.email, account.password)

    assert response.status_code == 200
    body = response.json()
    assert body["user_id"] == account.user_id
    assert body["email"] == account.email
    assert body["is_admin"] is False
    assert body["workspaces"] == [
        {"id": account.workspace_id, "name": account.email, "plan": "starter"}
    ]
    expires_at = datetime.fromisoformat(body["expires_at"])
    assert abs(expires_at - (runtime(service).clock.now() + timedelta(days=7))) < timedelta(
        minutes=1
    )
    (set_cookie,) = response.headers.get_list("set-cookie")
    attributes = [part.strip().lower() for part in set_cookie.split(";")]
    assert attributes[0].startswith(f"{COOKIE}=")
    assert "httponly" in attributes
    assert "path=/" in attributes
    assert "samesite=lax" in attributes
    assert response.cookies[COOKIE]


async def test_login_ignores_the_case_of_the_email(service: Service) -> None:
    account = await service.account()
    response = await login(service, account.email.upper(), account.password)
    assert response.status_code == 200
    assert response.json()["user_id"] == account.user_id


@pytest.mark.parametrize("mistake", ["wrong password", "unknown email"])
async def test_login_with_wrong_credentials_is_401(service: Service, mistake: str) -> None:
    account = await service.account()
    if mistake == "wrong password":
        response = await login(service, account.email, account.password + "!")
    else:
        response = await login(service, "nobody@example.org", account.password)
    assert_error(response, 401, "unauthorized")
    assert COOKIE not in response.cookies


async def test_cookie_authenticates_a_get_without_origin(service: Service) -> None:
    account = await service.account()
    token = await session_token(service, account)

    response = await with_cookie(service, token).get("/v1/api-keys/")

    assert response.status_code == 200
    assert [key["name"] for key in response.json()] == ["default"]


@pytest.mark.parametrize(
    "origin",
    [None, "http://evil.test", "https://postroom.test", "http://postroom.test.evil.test", "null"],
)
async def test_cookie_post_without_the_public_origin_is_refused(
    service: Service, origin: str | None
) -> None:
    account = await service.account("starter")
    token = await session_token(service, account)
    headers = {} if origin is None else {"Origin": origin}

    response = await with_cookie(service, token, **headers).post(
        "/v1/api-keys/", json={"name": "cross-site"}
    )

    assert_error(response, 403, "csrf_failed")
    names = [key["name"] for key in (await account.client.get("/v1/api-keys/")).json()]
    assert "cross-site" not in names


async def test_cookie_post_with_the_public_origin_works(service: Service) -> None:
    account = await service.account("starter")
    token = await session_token(service, account)

    response = await with_cookie(service, token, **SAME_ORIGIN).post(
        "/v1/api-keys/", json={"name": "same-site"}
    )

    assert response.status_code == 201, response.text
    key_client = service.client(headers={"Authorization": f"Bearer {response.json()['key']}"})
    items = (await key_client.get("/v1/audit-log")).json()["items"]
    entry = next(i for i in items if i["target_id"] == response.json()["id"])
    assert entry["actor"] == account.email


async def test_workspace_header_of_a_foreign_workspace_is_404(service: Service) -> None:
    alice = await service.account()
    bob = await service.account()
    token = await session_token(service, alice)

    response = await with_cookie(service, token, **{"X-Workspace-Id": bob.workspace_id}).get(
        "/v1/api-keys/"
    )

    assert_error(response, 404, "not_found")
    bogus = await with_cookie(service, token, **{"X-Workspace-Id": "not-a-workspace"}).get(
        "/v1/api-keys/"
    )
    assert_error(bogus, 404, "not_found")


async def test_workspace_defaults_to_the_users_oldest(service: Service, clock: MockClock) -> None:
    account = await service.account("free")
    clock.jump(5)
    rt = runtime(service)
    second = Workspace(new_id(), "second", "pro", account.user_id, rt.clock.now())
    await rt.db.write(account_rows.insert_workspace, second)
    login_response = await login(service, account.email, account.password)
    token = login_response.cookies[COOKIE]

    assert [w["id"] for w in login_response.json()["workspaces"]] == [
        account.workspace_id,
        second.id,
    ]
    default = await with_cookie(service, token).get("/v1/api-keys/")
    assert [key["name"] for key in default.json()] == ["default"]
    chosen = await with_cookie(service, token, **{"X-Workspace-Id": second.id}).get("/v1/api-keys/")
    assert chosen.status_code == 200
    assert chosen.json() == []
    created = await with_cookie(
        service, token, **{"X-Workspace-Id": second.id}, **SAME_ORIGIN
    ).post("/v1/api-keys/", json={"name": "in-second"})
    assert created.status_code == 201
    first_names = [key["name"] for key in (await account.client.get("/v1/api-keys/")).json()]
    assert "in-second" not in first_names


async def test_logout_ends_the_session_for_good(service: Service) -> None:
    account = await service.account()
    token = await session_token(service, account)
    assert (await with_cookie(service, token).get("/v1/api-keys/")).status_code == 200

    refused = await with_cookie(service, token).post("/v1/auth/logout")
    assert_error(refused, 403, "csrf_failed")
    response = await with_cookie(service, token, **SAME_ORIGIN).post("/v1/auth/logout")

    assert response.status_code == 204
    assert response.content == b""
    (cleared,) = response.headers.get_list("set-cookie")
    assert cleared.startswith(f"{COOKIE}=")
    assert "max-age=0" in cleared.lower().replace(" ", "")
    replayed = await with_cookie(service, token).get("/v1/api-keys/")
    assert_error(replayed, 401, "unauthorized")
    again = await with_cookie(service, token, **SAME_ORIGIN).post("/v1/auth/logout")
    assert_error(again, 401, "unauthorized")


async def test_logging_out_one_session_keeps_the_others(service: Service) -> None:
    account = await service.account()
    ended = await session_token(service, account)
    kept = await session_token(service, account)

    await with_cookie(service, ended, **SAME_ORIGIN).post("/v1/auth/logout")

    assert (await with_cookie(service, kept).get("/v1/api-keys/")).status_code == 200
    assert (await with_cookie(service, ended).get("/v1/api-keys/")).status_code == 401


def _sign(claims: dict[str, Any]) -> str:
    """A token signed with a key that is not the service's."""
    return jwt.encode(claims, secrets.token_urlsafe(48), algorithm="HS256")


def _b64_json(value: dict[str, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()


def _forgeries(token: str, service_key: str) -> dict[str, str]:
    claims = jwt.decode(token, options={"verify_signature": False})
    header, payload, signature = token.split(".")
    other_payload = _sign({**claims, "sid": new_id()}).split(".")[1]
    flipped = signature[:-2] + ("A" if signature[-2] != "A" else "B") + signature[-1]
    return {
        "flipped signature": f"{header}.{payload}.{flipped}",
        "swapped payload": f"{header}.{other_payload}.{signature}",
        "wrong key": _sign(claims),
        "alg none": f"{_b64_json({'alg': 'none', 'typ': 'JWT'})}.{payload}.",
        "no signature": f"{header}.{payload}.",
        "unknown session": jwt.encode({**claims, "sid": new_id()}, service_key, algorithm="HS256"),
        "garbage": "not-a-jwt",
        "empty": "",
    }


FORGERIES = [
    "flipped signature",
    "swapped payload",
    "wrong key",
    "alg none",
    "no signature",
    "unknown session",
    "garbage",
    "empty",
]


@pytest.mark.parametrize("forgery", FORGERIES)
async def test_tampered_or_forged_token_is_401(service: Service, forgery: str) -> None:
    account = await service.account()
    token = await session_token(service, account)

    forged = _forgeries(token, runtime(service).secret_key)[forgery]
    response = await with_cookie(service, forged).get("/v1/api-keys/")

    assert_error(response, 401, "unauthorized")


async def test_session_expires_after_seven_days(service: Service, clock: MockClock) -> None:
    account = await service.account()
    token = await session_token(service, account)

    clock.jump(6 * 24 * 3600)
    await trio.sleep(0.01)
    assert (await with_cookie(service, token).get("/v1/api-keys/")).status_code == 200

    clock.jump(2 * 24 * 3600)
    await trio.sleep(0.01)
    response = await with_cookie(service, token).get("/v1/api-keys/")
    assert_error(response, 401, "unauthorized")


async def test_reauth_with_the_right_password_lasts_five_minutes(service: Service) -> None:
    account = await service.account()
    token = await session_token(service, account)

    response = await with_cookie(service, token, **SAME_ORIGIN).post(
        "/v1/auth/reauth", json={"password": account.password}
    )

    assert response.status_code == 200, response.text
    assert set(response.json()) == {"reauthenticated_until"}
    raw_until = response.json()["reauthenticated_until"]
    assert raw_until.endswith("Z")
    until = datetime.fromisoformat(raw_until)
    expected = runtime(service).clock.now() + timedelta(minutes=5)
    assert abs(until - expected) < timedelta(seconds=10)


async def test_reauth_with_a_wrong_password_is_401(service: Service) -> None:
    account = await service.account()
    token = await session_token(service, account)

    response = await with_cookie(service, token, **SAME_ORIGIN).post(
        "/v1/auth/reauth", json={"password": "not the password"}
    )

    assert_error(response, 401, "unauthorized")
    # The session itself is still good.
    assert (await with_cookie(service, token).get("/v1/api-keys/")).status_code == 200


async def test_reauth_needs_the_public_origin(service: Service) -> None:
    account = await service.account()
    token = await session_token(service, account)
    response = await with_cookie(service, token).post(
        "/v1/auth/reauth", json={"password": account.password}
    )
    assert_error(response, 403, "csrf_failed")


async def test_reauth_with_an_api_key_is_403(service: Service) -> None:
    account = await service.account()
    response = await account.client.post("/v1/auth/reauth", json={"password": account.password})
    assert_error(response, 403, "forbidden")


async def test_login_is_logged_as_session_created(service: Service) -> None:
    account = await service.account()
    await session_token(service, account)

    page = (await account.client.get("/v1/audit-log", params={"category": "Security"})).json()

    entry = next(i for i in page["items"] if i["action"] == "session.created")
    assert entry["category"] == "Security"
    assert entry["actor"] == account.email
    assert entry["target_type"] == "Session"
    assert entry["target_name"] == account.email
    failed = await login(service, account.email, "wrong password")
    assert failed.status_code == 401
    after = (await account.client.get("/v1/audit-log", params={"category": "Security"})).json()
    assert [i["action"] for i in after["items"]].count("session.created") == 1
