"""Accounts: users, their workspaces and plans, and password sessions.

A user with two-factor sign-in (engine/accounts/totp.py) gets no session from a password alone:
`login` answers with a short-lived pending-login token, which totp.finish_login takes with a
code.

A user owns one or more workspaces; every resource belongs to a workspace and the plan is the
workspace's. `create_account` makes the user, a first workspace and a first API key in one
unit of work, for the `postroom accounts create` command. Password checks (login and
re-authentication) are counted against `engine.login_limits` before any argon2 is spent.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta

import jwt

from engine import plans
from engine.accounts import login_limits
from engine.accounts.api_keys import PERMISSIONS, insert_key
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform.errors import Conflict, Forbidden, NotFound, Unauthorized, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import accounts, sandbox, totp
from storage.accounts import Session, User, Workspace
from storage.codec import new_id, new_random_id
from storage.tx import Tx

SESSION_LIFETIME = timedelta(days=7)
REAUTH_WINDOW = timedelta(minutes=5)
SESSION_COOKIE = "postroom_session"
# How long a correct password waits for its second factor.
PENDING_LOGIN_LIFETIME = timedelta(minutes=5)
PENDING_LOGIN = "pending_login"  # the `typ` claim of a pending-login token
MIN_PASSWORD_LENGTH = 8


@dataclass(frozen=True, slots=True)
class CreatedAccount:
    user_id: str
    workspace_id: str
    email: str
    plan: str
    api_key: str


def _check_plan(name: str) -> str:
    if name not in plans.PLAN_NAMES:
        raise Unprocessable(f"unknown plan {name!r}; choose one of {', '.join(plans.PLAN_NAMES)}")
    return name


def _insert_account(
    tx: Tx, user: User, workspace: Workspace, sandboxed: bool, first_user: bool
) -> CreatedAccount:
    if first_user and accounts.has_users(tx, lock=True):
        raise Conflict("this service is set up already: sign in", code="already_set_up")
    if accounts.user_by_email(tx, user.email) is not None:
        raise Conflict(f"an account with {user.email} already exists", code="email_taken")
    accounts.insert_user(tx, user)
    accounts.insert_workspace(tx, workspace)
    if sandboxed:  # POSTROOM_SANDBOX=on: a new workspace starts in the sandbox
        sandbox.set_sandboxed(tx, workspace.id, True)
        meta = {"by": "POSTROOM_SANDBOX"}
        change = Change("sandbox.enabled", workspace.name, workspace.id, meta)
        record(tx, workspace.id, user.email, change, user.created_at)
    created = insert_key(
        tx,
        workspace.id,
        workspace.plan,
        user.id,
        user.email,
        "default",
        PERMISSIONS,
        user.created_at,
    )
    return CreatedAccount(user.id, workspace.id, user.email, workspace.plan, created.raw)


async def create_account(
    rt: Runtime,
    email: str,
    password: str,
    plan: str = "free",
    admin: bool = False,
    *,
    first_user: bool = False,
) -> CreatedAccount:
    """A new user with a workspace on `plan` and a first API key; with `first_user`, only
    while the service has no user at all (Conflict `already_set_up`: the console's first run)."""
    address = normalize_email(email)
    _check_plan(plan)
    if len(password) < MIN_PASSWORD_LENGTH:
        raise Unprocessable(f"the password must have at least {MIN_PASSWORD_LENGTH} characters")
    now = rt.clock.now()
    user = User(new_id(), address, await rt.passwords.hash(password), admin, now)
    workspace = Workspace(new_random_id(), address, plan, user.id, now)
    return await rt.db.write(_insert_account, user, workspace, rt.sandbox, first_user)


async def is_set_up(rt: Runtime) -> bool:
    """Whether the service has a user yet (the console offers its first-run form until then)."""
    return await rt.db.read(accounts.has_users)


def _set_plan(tx: Tx, email: str, plan: str, now: datetime) -> list[str]:
    user = accounts.user_by_email(tx, email)
    if user is None:
        raise NotFound(f"no account uses {email}")
    changed = []
    for workspace in accounts.owned_workspaces(tx, user.id):
        if workspace.plan != plan:
            accounts.set_plan(tx, workspace.id, plan)
            change = Change(
                "workspace.plan_changed",
                workspace.name,
                workspace.id,
                {"from": workspace.plan, "to": plan},
            )
            record(tx, workspace.id, user.email, change, now)
        changed.append(workspace.id)
    tx.notify("keys")  # cached keys carry their workspace's plan: every node forgets them
    return changed


async def set_plan(rt: Runtime, email: str, plan: str) -> list[str]:
    """Put every workspace the user owns on `plan`; their ids."""
    return await rt.db.write(_set_plan, normalize_email(email), _check_plan(plan), rt.clock.now())


@dataclass(frozen=True, slots=True)
class LoggedIn:
    token: str
    user: User
    workspaces: list[Workspace]
    expires_at: datetime


def _admit(
    tx: Tx,
    attempt: login_limits.Attempt,
    find: Callable[[Tx, str], User | None],
    ident: str,
    now: datetime,
) -> User | None:
    login_limits.count(tx, attempt, now)
    return find(tx, ident)


async def _password_owner(
    rt: Runtime,
    attempt: login_limits.Attempt,
    find: Callable[[Tx, str], User | None],
    ident: str,
    password: str,
) -> User | None:
    """The user `find` names if `password` is theirs, else None.

    The attempt is counted before the password is checked, and an unknown user costs the
    same argon2 as a known one. RateLimited when a limit is reached or the queue for the
    password threads is full.
    """
    with rt.passwords.place():
        user = await rt.db.write(_admit, attempt, find, ident, rt.clock.now())
        if await rt.passwords.verify(user.password_hash if user else None, password):
            return user
    return None


@dataclass(frozen=True, slots=True)
class SecondFactorNeeded:
    """A correct password of a user with two-factor sign-in: no session yet, but a token that
    totp.finish_login takes with a code until `expires_at`."""

    pending_token: str
    expires_at: datetime


def open_session(
    tx: Tx, user: User, session: Session, attempt: login_limits.Attempt, now: datetime
) -> list[Workspace]:
    """Forgive the account's failed attempts, open `session` and record it; the user's
    workspaces."""
    login_limits.succeeded(tx, attempt)
    accounts.insert_session(tx, session, now)
    workspaces = accounts.workspaces_of(tx, user.id)
    for workspace in workspaces:
        record(tx, workspace.id, user.email, Change("session.created", user.email, session.id), now)
    return workspaces


def _open_password_session(
    tx: Tx, user: User, session: Session, attempt: login_limits.Attempt, now: datetime
) -> list[Workspace] | None:
    if totp.is_enabled(tx, user.id):
        # The password alone opens nothing, and forgives no failures: only the second factor
        # does, or a known password would buy fresh guesses at the code each time.
        return None
    return open_session(tx, user, session, attempt, now)


async def login(
    rt: Runtime, email: str, password: str, client: str | None
) -> LoggedIn | SecondFactorNeeded:
    """Check a password and open a session, or, for a user with two-factor sign-in, hand out
    a pending-login token; Unauthorized on any mismatch.

    `client` is the caller's peer address, for the per-address limit.
    """
    email = email.strip().lower()  # as users are looked up
    attempt = login_limits.attempt(email, client)
    user = await _password_owner(rt, attempt, accounts.user_by_email, email, password)
    if user is None:
        raise Unauthorized("wrong email or password")
    now = rt.clock.now()
    session = Session(new_id(), user.id, now + SESSION_LIFETIME, None, revoked=False)
    workspaces = await rt.db.write(_open_password_session, user, session, attempt, now)
    if workspaces is None:
        expires_at = now + PENDING_LOGIN_LIFETIME
        pending = jwt.encode(
            {"typ": PENDING_LOGIN, "sub": user.id, "exp": int(expires_at.timestamp())},
            rt.secret_key,
            algorithm="HS256",
        )
        return SecondFactorNeeded(pending, expires_at)
    return session_token(rt, user, session, workspaces)


def session_token(
    rt: Runtime, user: User, session: Session, workspaces: list[Workspace]
) -> LoggedIn:
    """The signed session cookie of an opened session."""
    token = jwt.encode(
        {"sid": session.id, "sub": user.id, "exp": int(session.expires_at.timestamp())},
        rt.secret_key,
        algorithm="HS256",
    )
    return LoggedIn(token, user, workspaces, session.expires_at)


async def logout(rt: Runtime, who: Principal) -> None:
    """End the principal's session for good (a key-authenticated call changes nothing)."""
    if who.session_id is not None:
        await rt.db.write(accounts.revoke_session, who.session_id, rt.clock.now())


def _mark_reauthenticated(
    tx: Tx, session_id: str, until: datetime, attempt: login_limits.Attempt
) -> None:
    login_limits.succeeded(tx, attempt)
    accounts.mark_reauthenticated(tx, session_id, until)


async def reauthenticate(
    rt: Runtime, who: Principal, password: str, client: str | None
) -> datetime:
    """Mark the session re-authenticated for five minutes; the time it lapses.

    Counted against the same limits as a login to the account, from peer address `client`.
    """
    if who.session_id is None:
        raise Forbidden("re-authentication needs a session cookie, not an API key")
    attempt = login_limits.attempt(who.user_email, client)
    if await _password_owner(rt, attempt, accounts.user_by_id, who.user_id, password) is None:
        raise Unauthorized("wrong password")
    until = rt.clock.now() + REAUTH_WINDOW
    await rt.db.write(_mark_reauthenticated, who.session_id, until, attempt)
    return until


def _set_password(
    tx: Tx, who: Principal, password_hash: str, attempt: login_limits.Attempt, now: datetime
) -> None:
    login_limits.succeeded(tx, attempt)
    accounts.set_password(tx, who.user_id, password_hash)
    accounts.revoke_other_sessions(tx, who.user_id, who.session_id, now)
    for workspace in accounts.workspaces_of(tx, who.user_id):
        change = Change("password.changed", who.user_email, who.user_id)
        record(tx, workspace.id, who.user_email, change, now)


async def change_password(
    rt: Runtime, who: Principal, current: str, new: str, client: str | None
) -> None:
    """Replace the signed-in user's password after checking the current one (counted like a
    login); every other session of the user ends, as a stolen one should."""
    if who.session_id is None:
        raise Forbidden("changing the password needs a session cookie, not an API key")
    if len(new) < MIN_PASSWORD_LENGTH:
        raise Unprocessable(f"the password must have at least {MIN_PASSWORD_LENGTH} characters")
    attempt = login_limits.attempt(who.user_email, client)
    if await _password_owner(rt, attempt, accounts.user_by_id, who.user_id, current) is None:
        raise Unauthorized("wrong password")
    password_hash = await rt.passwords.hash(new)
    await rt.db.write(_set_password, who, password_hash, attempt, rt.clock.now())


def _is_admin(tx: Tx, user_id: str) -> bool:
    user = accounts.user_by_id(tx, user_id)
    return user is not None and user.is_admin


async def require_admin(rt: Runtime, who: Principal) -> None:
    """Forbidden (`admin_required`) unless `who` is a platform administrator."""
    if not await rt.db.read(_is_admin, who.user_id):
        raise Forbidden("platform administrators only", code="admin_required")
