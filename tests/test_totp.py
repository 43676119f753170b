"""Two-factor sign-in (TOTP): enrolment confirmed by a first code, the two-step login that opens
a session only after the code, wrong and replayed codes, recovery codes used once, codes
counted against the password-guessing limits, turning it off, the secret sealed at rest, and a
workspace owner requiring it (members without it get 403 `two_factor_required`; API keys do
not). Codes are made with pyotp from the service's own clock, as an authenticator app would.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import httpx
import pyotp
from trio.testing import MockClock

from engine.accounts import login_limits
from tests.harness.api import assert_error
from tests.harness.clock import runtime
from tests.harness.dns_server import DnsServer
from tests.harness.sending import route_mail
from tests.harness.service import Account, Service
from tests.harness.sessions import COOKIE, SAME_ORIGIN, login, with_cookie
from tests.harness.smtp_sink import SmtpSink
from tests.harness.team import PASSWORD, join_as_new_user, owner_session

STEP = 30  # seconds of one TOTP time step


def code_now(service: Service, secret: str, offset: int = 0) -> str:
    """The code an authenticator app shows now (`offset` steps later)."""
    now = runtime(service).clock.now()
    return pyotp.TOTP(secret).at(now, counter_offset=offset)


class Enrolment(NamedTuple):
    secret: str
    recovery_codes: list[str]
    confirmed_with: str  # the code that confirmed it, spent from then on


async def enrolled(service: Service, client: httpx.AsyncClient) -> Enrolment:
    """Enrol and confirm the client's user."""
    made = await client.post("/v1/auth/totp/enrol")
    assert made.status_code == 200, made.text
    secret: str = made.json()["secret"]
    code = code_now(service, secret)
    confirmed = await client.post("/v1/auth/totp/confirm", json={"code": code})
    assert confirmed.status_code == 200, confirmed.text
    return Enrolment(secret, confirmed.json()["recovery_codes"], code)


async def pending(service: Service, email: str, password: str) -> str:
    """The first step: the password answers 202 with a pending-login token, no cookie."""
    response = await login(service, email, password)
    assert response.status_code == 202, response.text
    assert COOKIE not in response.cookies
    body: dict[str, Any] = response.json()
    assert body["second_factor"] == "totp"
    token: str = body["pending_token"]
    return token


async def second_step(service: Service, token: str, code: str) -> httpx.Response:
    return await service.client().post(
        "/v1/auth/totp/login", json={"pending_token": token, "code": code}
    )


async def signed_in(service: Service, account: Account) -> httpx.AsyncClient:
    token = (await login(service, account.email, account.password)).cookies[COOKIE]
    return with_cookie(service, token, **SAME_ORIGIN)


async def test_enrol_confirm_and_sign_in_with_a_code(service: Service, clock: MockClock) -> None:
    account = await service.account()
    client = await signed_in(service, account)
    made = (await client.post("/v1/auth/totp/enrol")).json()
    assert made["otpauth_uri"].startswith("otpauth://totp/Postroom:")
    assert made["secret"] in made["otpauth_uri"]
    assert (await client.get("/v1/auth/totp/")).json() == {
        "enabled": False,
        "enrolling": True,
        "recovery_codes_left": 0,
        "required": False,
    }
    # A wrong first code turns nothing on; the right one does and hands out recovery codes.
    wrong = code_now(service, made["secret"], 5)
    assert_error(
        await client.post("/v1/auth/totp/confirm", json={"code": wrong}), 401, "unauthorized"
    )
    confirmed = await client.post(
        "/v1/auth/totp/confirm", json={"code": code_now(service, made["secret"])}
    )
    assert confirmed.status_code == 200, confirmed.text
    assert len(set(confirmed.json()["recovery_codes"])) == 10
    status = (await client.get("/v1/auth/totp/")).json()
    assert status["enabled"] and status["recovery_codes_left"] == 10
    # The secret is never shown again: enrolling anew is refused while it is on.
    assert_error(await client.post("/v1/auth/totp/enrol"), 409, "two_factor_enabled")

    service.clock.jump(STEP)
    token = await pending(service, account.email, account.password)
    finished = await second_step(service, token, code_now(service, made["secret"]))
    assert finished.status_code == 200, finished.text
    assert finished.json()["email"] == account.email
    session = with_cookie(service, finished.cookies[COOKIE])
    assert (await session.get("/v1/domains/")).status_code == 200
    actions = {
        item["action"]
        for item in (await account.client.get("/v1/audit-log?range=7d")).json()["items"]
    }
    assert {"two_factor.enabled", "session.created"} <= actions


async def test_turning_it_on_ends_the_users_other_sessions_but_not_keys(
    service: Service,
) -> None:
    account = await service.account()
    here, elsewhere = await signed_in(service, account), await signed_in(service, account)
    assert (await elsewhere.get("/v1/domains/")).status_code == 200
    await enrolled(service, here)
    # A session opened with the password alone (a stolen one, say) ends; this one goes on.
    assert (await elsewhere.get("/v1/domains/")).status_code == 401
    assert (await here.get("/v1/domains/")).status_code == 200
    assert (await account.client.get("/v1/domains/")).status_code == 200  # an API key


async def test_a_wrong_code_a_replayed_code_and_a_forged_token_open_nothing(
    service: Service, clock: MockClock
) -> None:
    account = await service.account()
    secret, _, spent = await enrolled(service, await signed_in(service, account))
    token = await pending(service, account.email, account.password)
    # The code that confirmed the enrolment is spent: it does not sign in. (Not code_now: the
    # clock runs, and a new time step may have begun since.)
    assert_error(await second_step(service, token, spent), 401, "unauthorized")
    service.clock.jump(STEP)
    code = code_now(service, secret)
    too_late = code_now(service, secret, 5)  # outside the drift allowed
    assert_error(await second_step(service, token, too_late), 401, "unauthorized")
    first = await second_step(service, token, code)
    assert first.status_code == 200, first.text
    # The same code within its window, even with a fresh password step, is a replay.
    again = await pending(service, account.email, account.password)
    assert_error(await second_step(service, again, code), 401, "unauthorized")
    # A session token is not a pending login, nor is a lapsed pending login.
    assert_error(await second_step(service, first.cookies[COOKIE], code), 401, "unauthorized")
    service.clock.jump(6 * 60)
    assert_error(await second_step(service, again, code_now(service, secret)), 401, "unauthorized")


async def test_a_recovery_code_signs_in_once(service: Service) -> None:
    account = await service.account()
    client = await signed_in(service, account)
    codes = (await enrolled(service, client)).recovery_codes
    token = await pending(service, account.email, account.password)
    used = await second_step(service, token, codes[0].upper().replace("-", ""))
    assert used.status_code == 200, used.text
    token = await pending(service, account.email, account.password)
    assert_error(await second_step(service, token, codes[0]), 401, "unauthorized")
    assert (await second_step(service, token, codes[1])).status_code == 200
    assert (await client.get("/v1/auth/totp/")).json()["recovery_codes_left"] == 8


async def test_wrong_codes_are_counted_like_wrong_passwords(service: Service) -> None:
    account = await service.account()
    secret = (await enrolled(service, await signed_in(service, account))).secret
    token = await pending(service, account.email, account.password)
    # The password step counts one attempt, which only the second factor forgives: else the
    # password, once known, would buy a fresh set of guesses at the code each time.
    for _ in range(login_limits.ACCOUNT.attempts - 1):
        assert_error(await second_step(service, token, "999999"), 401, "unauthorized")
    limited = await second_step(service, token, code_now(service, secret, 1))
    assert_error(limited, 429, "rate_limited")
    assert int(limited.headers["Retry-After"]) > 0


async def test_turning_it_off_needs_a_code_or_the_password(
    service: Service, clock: MockClock
) -> None:
    account = await service.account()
    client = await signed_in(service, account)
    secret = (await enrolled(service, client)).secret
    refused = await client.post("/v1/auth/totp/disable", json={})
    assert_error(refused, 422, "validation_error")
    wrong = await client.post("/v1/auth/totp/disable", json={"password": "not the password"})
    assert_error(wrong, 401, "unauthorized")
    service.clock.jump(STEP)
    off = await client.post("/v1/auth/totp/disable", json={"code": code_now(service, secret)})
    assert off.status_code == 204, off.text
    assert (await login(service, account.email, account.password)).status_code == 200
    # On again, then off with the password.
    await enrolled(service, client)
    off = await client.post("/v1/auth/totp/disable", json={"password": account.password})
    assert off.status_code == 204, off.text
    actions = [
        item["action"]
        for item in (await account.client.get("/v1/audit-log?range=7d")).json()["items"]
    ]
    assert actions.count("two_factor.disabled") == 2


async def test_the_secret_is_sealed_at_rest(service: Service) -> None:
    account = await service.account()
    made = (await (await signed_in(service, account)).post("/v1/auth/totp/enrol")).json()

    def stored(tx: Any) -> str:
        value: str = tx.value(
            "SELECT secret FROM user_totp WHERE user_id = :u", {"u": account.user_id}
        )
        return value

    value = await runtime(service).db.read(stored)
    assert value.startswith("enc:v1:") and made["secret"] not in value


async def test_an_owner_requires_it_of_every_member_but_not_of_keys(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    route_mail(dns_server, "example.org")
    owner = await service.account("business")
    owner_client = await owner_session(service, owner)
    _, member = await join_as_new_user(service, owner, smtp_sink, "developer")
    # Only an owner with two-factor sign-in of their own may require it.
    required = {"required": True}
    assert_error(
        await member.put("/v1/auth/totp/requirement", json=required), 403, "role_forbidden"
    )
    refused = await owner_client.put("/v1/auth/totp/requirement", json=required)
    assert_error(refused, 409, "two_factor_not_enabled")
    await enrolled(service, owner_client)
    answer = await owner_client.put("/v1/auth/totp/requirement", json=required)
    assert answer.status_code == 200, answer.text
    assert answer.json()["required"] is True

    # The member without it may only enrol; the owner's key goes on as before.
    assert_error(await member.get("/v1/domains/"), 403, "two_factor_required")
    assert (await owner.client.get("/v1/domains/")).status_code == 200
    assert (await member.get("/v1/auth/totp/")).json()["required"] is True
    call = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    mcp = await member.post("/mcp", json=call, headers={"Accept": "application/json"})
    assert mcp.status_code == 403 and "two_factor_required" in mcp.text, mcp.text
    # The console sends them to the enrol page.
    sent = await member.get("/domains")
    assert sent.status_code == 303 and sent.headers["Location"].endswith("/account/two-factor")
    assert (await member.get("/account/two-factor")).status_code == 200
    await enrolled(service, member)
    assert (await member.get("/v1/domains/")).status_code == 200
    # While required, the member cannot turn it off.
    off = await member.post("/v1/auth/totp/disable", json={"password": PASSWORD})
    assert_error(off, 409, "two_factor_required")

    lifted = await owner_client.put("/v1/auth/totp/requirement", json={"required": False})
    assert lifted.json()["required"] is False
    actions = [
        item["action"]
        for item in (await owner.client.get("/v1/audit-log?range=7d")).json()["items"]
    ]
    assert {"two_factor.required", "two_factor.not_required"} <= set(actions)
