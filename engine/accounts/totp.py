"""Two-factor sign-in with TOTP (RFC 6238, by pyotp): enrolment, recovery codes, the second
step of a login, and a workspace requiring it of its members.

A user enrols (a secret, shown once), confirms with a first code and gets ten single-use
recovery codes (kept only hashed); from then on a password gives only a pending-login token
(engine/accounts/users.py) that `finish_login` turns into a session with a code. Every code
checked is counted against the password-guessing limits (engine/accounts/login_limits.py)
before it is checked, and a code is accepted once: the last accepted time step is stored and
a code for it or an earlier step is refused.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass
from datetime import datetime

import jwt
import pyotp

from engine.accounts import login_limits, users
from engine.accounts.passwords import token_hash
from engine.activity import Change, record
from engine.platform.errors import Conflict, Forbidden, Unauthorized
from engine.platform.runtime import Principal, Runtime
from storage import accounts
from storage import totp as store
from storage.accounts import Session, User, Workspace
from storage.codec import new_id
from storage.tx import Tx

ISSUER = "Postroom"  # the name authenticator apps show beside the account
RECOVERY_CODES = 10
# A code of the step before or after the current one is accepted too: clocks drift and
# people type slowly.
DRIFT_STEPS = 1
WRONG_CODE = "wrong code, or a code already used; wait for the next one"


@dataclass(frozen=True, slots=True)
class Enrolment:
    """A new secret, as text and as the otpauth:// URI authenticator apps read."""

    secret: str
    uri: str


@dataclass(frozen=True, slots=True)
class Status:
    enabled: bool
    enrolling: bool  # a secret was handed out and awaits its first code
    recovery_codes_left: int
    required: bool  # the principal's workspace requires two-factor sign-in


def _session_only(who: Principal) -> None:
    if who.session_id is None:
        raise Forbidden("two-factor sign-in is changed by a signed-in person, not an API key")


def matching_step(secret: str, code: str, now: datetime) -> int | None:
    """The time step whose code `code` is, within the drift allowed around `now`; else None."""
    otp = pyotp.TOTP(secret)
    current = otp.timecode(now)
    for step in range(current - DRIFT_STEPS, current + DRIFT_STEPS + 1):
        if hmac.compare_digest(otp.generate_otp(step), code):
            return step
    return None


def _is_totp_code(code: str) -> bool:
    return len(code) == 6 and code.isdigit()


def _clean(code: str) -> str:
    # Apps show codes as `123 456`; people paste them with the space.
    return code.strip().replace(" ", "")


def _recovery_hash(code: str) -> str:
    # As shown (`abcd-ef01-…`) or typed without dashes, spaces or in capitals.
    return token_hash(code.replace("-", "").replace(" ", "").lower())


def _new_recovery_codes() -> list[str]:
    codes = []
    for _ in range(RECOVERY_CODES):
        raw = secrets.token_hex(8)
        codes.append("-".join(raw[i : i + 4] for i in range(0, len(raw), 4)))
    return codes


def _record(tx: Tx, user_id: str, email: str, change: Change, now: datetime) -> None:
    """Log a change of the user's sign-in in every workspace they belong to."""
    for workspace in accounts.workspaces_of(tx, user_id):
        record(tx, workspace.id, email, change, now)


def _status(tx: Tx, who: Principal) -> Status:
    found = store.of_user(tx, who.user_id)
    enabled = found is not None and found.confirmed_at is not None
    return Status(
        enabled=enabled,
        enrolling=found is not None and not enabled,
        recovery_codes_left=store.recovery_codes_left(tx, who.user_id) if enabled else 0,
        required=store.is_required(tx, who.workspace_id),
    )


async def status(rt: Runtime, who: Principal) -> Status:
    """The caller's two-factor sign-in, and whether their workspace requires it."""
    return await rt.db.read(_status, who)


def _start(tx: Tx, user_id: str, secret: str, now: datetime) -> None:
    if store.is_enabled(tx, user_id):
        raise Conflict(
            "two-factor sign-in is on already; turn it off first to enrol a new device",
            code="two_factor_enabled",
        )
    store.start(tx, user_id, secret, now)


async def enrol(rt: Runtime, who: Principal) -> Enrolment:
    """A new secret for the caller, unconfirmed until `confirm` (a secret handed out before
    and never confirmed is replaced)."""
    _session_only(who)
    secret = pyotp.random_base32()
    await rt.db.write(_start, who.user_id, secret, rt.clock.now())
    return Enrolment(secret, _uri(secret, who.user_email))


def _unconfirmed_secret(tx: Tx, user_id: str) -> str | None:
    found = store.of_user(tx, user_id)
    if found is None or found.confirmed_at is not None:
        return None  # a confirmed secret is never shown again
    return found.secret


async def pending_enrolment(rt: Runtime, who: Principal) -> Enrolment | None:
    """The caller's secret while it awaits its first code (the console's enrol page shows it
    until then); None when they are not enrolling."""
    secret = await rt.db.read(_unconfirmed_secret, who.user_id)
    if secret is None:
        return None
    return Enrolment(secret, _uri(secret, who.user_email))


def _uri(secret: str, email: str) -> str:
    return pyotp.TOTP(secret).provisioning_uri(name=email, issuer_name=ISSUER)


def _confirm(
    tx: Tx,
    who: Principal,
    code: str,
    attempt: login_limits.Attempt,
    now: datetime,
    hashes: list[str],
) -> bool:
    login_limits.count(tx, attempt, now)
    found = store.of_user(tx, who.user_id, lock=True)
    if found is None or found.confirmed_at is not None:
        raise Conflict("no enrolment awaits a first code: enrol first", code="not_enrolling")
    step = matching_step(found.secret, _clean(code), now)
    if step is None:
        return False
    login_limits.succeeded(tx, attempt)
    store.confirm(tx, who.user_id, step, now, hashes)
    # Sessions signed in on the password alone end: one taken before would outlive the fix.
    accounts.revoke_other_sessions(tx, who.user_id, who.session_id, now)
    change = Change("two_factor.enabled", who.user_email, who.user_id)
    _record(tx, who.user_id, who.user_email, change, now)
    return True


async def confirm(rt: Runtime, who: Principal, code: str, client: str | None) -> list[str]:
    """Turn two-factor sign-in on with the first code of the enrolled secret; the ten recovery
    codes, which are never shown again. Every other session of the user ends (they were
    opened with the password alone). Unauthorized for a wrong code."""
    _session_only(who)
    codes = _new_recovery_codes()
    attempt = login_limits.attempt(who.user_email, client)
    hashes = [_recovery_hash(code) for code in codes]
    if not await rt.db.write(_confirm, who, code, attempt, rt.clock.now(), hashes):
        raise Unauthorized(WRONG_CODE)
    return codes


def _second_factor(tx: Tx, user_id: str, code: str, now: datetime) -> str | None:
    """Spend `code` (a TOTP code or a recovery code) of the user: which it was, or None when
    it is neither (or was used before)."""
    found = store.of_user(tx, user_id, lock=True)
    if found is None or found.confirmed_at is None:
        return None
    code = _clean(code)
    if _is_totp_code(code):
        step = matching_step(found.secret, code, now)
        return "code" if step is not None and store.accept_step(tx, user_id, step) else None
    if store.use_recovery_code(tx, user_id, _recovery_hash(code), now):
        return "recovery_code"
    return None


def _finish(
    tx: Tx, user: User, code: str, session: Session, attempt: login_limits.Attempt, now: datetime
) -> list[Workspace] | None:
    login_limits.count(tx, attempt, now)
    used = _second_factor(tx, user.id, code, now)
    if used is None:
        return None
    workspaces = users.open_session(tx, user, session, attempt, now)
    if used == "recovery_code":
        left = store.recovery_codes_left(tx, user.id)
        change = Change("two_factor.recovery_code_used", user.email, user.id, {"left": left})
        _record(tx, user.id, user.email, change, now)
    return workspaces


def _pending_user(rt: Runtime, pending_token: str, now: datetime) -> str:
    try:
        # Expiry is checked against the service clock, as sessions' are.
        claims = jwt.decode(
            pending_token, rt.secret_key, algorithms=["HS256"], options={"verify_exp": False}
        )
        if claims.get("typ") != users.PENDING_LOGIN:
            raise KeyError("typ")
        user_id, expires = str(claims["sub"]), int(claims["exp"])
    except (jwt.InvalidTokenError, KeyError, TypeError, ValueError):
        raise Unauthorized("invalid pending login; sign in again") from None
    if expires <= now.timestamp():
        raise Unauthorized("the sign-in waited too long for its code; sign in again")
    return user_id


async def finish_login(
    rt: Runtime, pending_token: str, code: str, client: str | None
) -> users.LoggedIn:
    """The second step of a login: a TOTP code or a recovery code for the pending login
    `users.login` handed out opens the session. Unauthorized for a wrong or used code,
    RateLimited as for passwords."""
    now = rt.clock.now()
    user = await rt.db.read(accounts.user_by_id, _pending_user(rt, pending_token, now))
    if user is None:
        raise Unauthorized("invalid pending login; sign in again")
    attempt = login_limits.attempt(user.email, client)
    session = Session(new_id(), user.id, now + users.SESSION_LIFETIME, None, revoked=False)
    workspaces = await rt.db.write(_finish, user, code, session, attempt, now)
    if workspaces is None:
        raise Unauthorized(WRONG_CODE)
    return users.session_token(rt, user, session, workspaces)


def _check_removable(tx: Tx, user_id: str) -> None:
    if store.required_workspaces(tx, user_id):
        raise Conflict(
            "a workspace you belong to requires two-factor sign-in; it stays on",
            code="two_factor_required",
        )


def _remove(tx: Tx, who: Principal, now: datetime) -> None:
    _check_removable(tx, who.user_id)
    store.remove(tx, who.user_id)
    change = Change("two_factor.disabled", who.user_email, who.user_id)
    _record(tx, who.user_id, who.user_email, change, now)


def _remove_with_code(
    tx: Tx, who: Principal, code: str, attempt: login_limits.Attempt, now: datetime
) -> bool:
    login_limits.count(tx, attempt, now)
    _check_removable(tx, who.user_id)
    if _second_factor(tx, who.user_id, code, now) is None:
        return False
    login_limits.succeeded(tx, attempt)
    _remove(tx, who, now)
    return True


async def disable(
    rt: Runtime, who: Principal, *, code: str | None, password: str | None, client: str | None
) -> None:
    """Turn the caller's two-factor sign-in off, proven by a current code (or a recovery
    code) or by the password (checked as a re-authentication is). Conflict while a workspace
    of theirs requires it."""
    _session_only(who)
    if not await rt.db.read(store.is_enabled, who.user_id):
        raise Conflict("two-factor sign-in is not on", code="two_factor_not_enabled")
    if password is not None:
        await users.reauthenticate(rt, who, password, client)
        await rt.db.write(_remove, who, rt.clock.now())
        return
    attempt = login_limits.attempt(who.user_email, client)
    if not await rt.db.write(_remove_with_code, who, code or "", attempt, rt.clock.now()):
        raise Unauthorized(WRONG_CODE)


def _set_required(tx: Tx, who: Principal, required: bool, now: datetime) -> None:
    if required and not store.is_enabled(tx, who.user_id):
        raise Conflict(
            "turn on two-factor sign-in for yourself before requiring it of everyone",
            code="two_factor_not_enabled",
        )
    if store.set_required(tx, who.workspace_id, required, who.user_email, now):
        action = "two_factor.required" if required else "two_factor.not_required"
        change = Change(action, who.workspace_id, who.workspace_id)
        record(tx, who.workspace_id, who.user_email, change, now)


async def set_required(rt: Runtime, who: Principal, required: bool) -> None:
    """Require two-factor sign-in of every member of the caller's workspace, or stop; members
    without it are sent to enrol before they use the workspace. API keys are unaffected."""
    _session_only(who)
    await rt.db.write(_set_required, who, required, rt.clock.now())
