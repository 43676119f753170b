"""Who is calling: an API key (Bearer) or a session cookie, resolved to a Principal.

Keys are looked up by hash and kept in `Runtime.key_cache` for a few seconds, so the hot send
path does not pay a database round trip per request. `last_used_at` is written at most once a
minute per key, through group commit.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime, timedelta

import jwt

from engine.accounts import roles
from engine.accounts.passwords import API_KEY_PREFIX, TEST_KEY_PREFIX, same, token_hash
from engine.platform.errors import Forbidden, NotFound, Unauthorized
from engine.platform.runtime import Principal, Runtime
from storage import accounts, api_keys, sandbox, totp
from storage.accounts import Membership, Session
from storage.tx import Tx

LAST_USED_PRECISION = timedelta(minutes=1)


async def authenticate_key(rt: Runtime, raw: str) -> Principal:
    """The principal an API key acts for; Unauthorized for unknown or deactivated keys,
    Forbidden `sandbox_only` for a test key whose workspace is not in the sandbox."""
    if not raw.startswith(API_KEY_PREFIX) or len(raw) > 200:
        raise Unauthorized("invalid API key")
    key_hash = token_hash(raw)
    holder = rt.key_cache.get(key_hash)
    if holder is None:
        holder = await rt.db.read(api_keys.holder_by_hash, key_hash)
        if holder is None or not same(holder.key_hash, key_hash):
            raise Unauthorized("invalid API key")
        rt.key_cache.put(holder)
    now = rt.clock.now()
    if holder.last_used_at is None or now - holder.last_used_at >= LAST_USED_PRECISION:
        rt.key_cache.put(replace(holder, last_used_at=now))
        await rt.db.write(api_keys.touch, holder.key_id, now)
    # A test key (engine/sandbox/keys.py) acts only while its workspace is in the sandbox,
    # through every door that takes API keys.
    test_key = raw.startswith(TEST_KEY_PREFIX)
    if test_key and not await rt.db.read(sandbox.is_sandboxed, holder.workspace_id):
        raise Forbidden(
            "test keys act only in sandbox mode, and this workspace is not in the sandbox",
            code="sandbox_only",
        )
    return Principal(
        user_id=holder.user_id,
        user_email=holder.user_email,
        workspace_id=holder.workspace_id,
        plan=holder.plan,
        api_key_id=holder.key_id,
        test_key=test_key,
        role=roles.KEY_ROLE,
    )


@dataclass(frozen=True, slots=True)
class SessionView:
    session: Session
    user_email: str
    memberships: list[Membership]
    two_factor: bool  # the user signs in with a second factor
    two_factor_required: frozenset[str]  # their workspaces that require it


def _session_view(tx: Tx, session_id: str) -> SessionView | None:
    session = accounts.session_by_id(tx, session_id)
    if session is None:
        return None
    user = accounts.user_by_id(tx, session.user_id)
    if user is None:
        return None
    return SessionView(
        session,
        user.email,
        accounts.memberships_of(tx, user.id),
        totp.is_enabled(tx, user.id),
        totp.required_workspaces(tx, user.id),
    )


@dataclass(frozen=True, slots=True)
class SessionPrincipal:
    principal: Principal
    reauthenticated_until: datetime | None
    # The workspace requires two-factor sign-in and the user has none: the API refuses
    # (`two_factor_required`) and the console sends them to enrol, but for the routes that
    # enrol (api/permissions.py).
    two_factor_missing: bool = False


async def authenticate_session(
    rt: Runtime, token: str, workspace_id: str | None
) -> SessionPrincipal:
    """The principal of a session cookie in the workspace the caller selected."""
    try:
        # Expiry is checked against the service clock below, not the host's.
        claims = jwt.decode(
            token, rt.secret_key, algorithms=["HS256"], options={"verify_exp": False}
        )
        session_id = str(claims["sid"])
    except (jwt.InvalidTokenError, KeyError):
        raise Unauthorized("invalid session") from None
    view = await rt.db.read(_session_view, session_id)
    now = rt.clock.now()
    if view is None or view.session.revoked or view.session.expires_at <= now:
        raise Unauthorized("session expired or ended; log in again")
    if not view.memberships:
        raise Forbidden("this user belongs to no workspace")
    if workspace_id is None:
        membership = view.memberships[0]
    else:
        # Membership is read on every request: a member removed loses the workspace at once.
        chosen = [m for m in view.memberships if m.workspace.id == workspace_id]
        if not chosen:
            raise NotFound("workspace not found")
        membership = chosen[0]
    principal = Principal(
        user_id=view.session.user_id,
        user_email=view.user_email,
        workspace_id=membership.workspace.id,
        plan=membership.workspace.plan,
        session_id=session_id,
        role=membership.role,
    )
    missing = not view.two_factor and membership.workspace.id in view.two_factor_required
    return SessionPrincipal(principal, view.session.reauth_until, missing)
