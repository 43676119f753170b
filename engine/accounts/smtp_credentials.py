"""SMTP relay credentials: create one per verified domain within the plan, list, deactivate,
and match a username and password for the relay (engine/sending/submission.py authenticates).

The username is derived (docs/architecture.md section 7: the first 8 characters of the
workspace id, `@`, the domain name); the password is a random token shown once, stored as
its SHA-256 hash (like API keys: it is high-entropy, so a slow hash buys nothing) and
compared in constant time.
Deactivation is irreversible; the relay refuses a deactivated credential at once, because
every AUTH reads the database.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime

from engine import plans
from engine.accounts.passwords import same, token_hash
from engine.activity import Change, record
from engine.platform.errors import Conflict, InvalidRequest, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import domains, smtp_credentials
from storage.codec import new_id
from storage.smtp_credentials import RelayLogin, SmtpCredential
from storage.tx import Tx

_PASSWORD_BYTES = 24
_MAX_USERNAME = 320  # a local part of 8 and a domain name of at most 253 fit easily


@dataclass(frozen=True, slots=True)
class CreatedCredential:
    credential: SmtpCredential
    password: str


def username_for(workspace_id: str, domain_name: str) -> str:
    return f"{workspace_id[:8]}@{domain_name}"


def _insert(
    tx: Tx, who: Principal, domain_id: str, password_hash: str, now: datetime
) -> SmtpCredential:
    domain = domains.get(tx, who.workspace_id, domain_id)
    if domain is None:
        raise NotFound("domain not found")
    if domain.status != "verified":
        raise InvalidRequest(
            f"{domain.name} is not verified; verify it before creating an SMTP credential",
            code="domain_not_verified",
        )
    if smtp_credentials.active_for_domain(tx, domain.id) is not None:
        raise Conflict(
            f"{domain.name} already has an active SMTP credential; delete it first",
            code="credential_exists",
        )
    plans.check_workspace_room(
        tx,
        who.workspace_id,
        plans.plan(who.plan).smtp_credentials,
        smtp_credentials.count_active,
        "SMTP credentials",
        who.plan,
    )
    credential = SmtpCredential(
        id=new_id(),
        workspace_id=who.workspace_id,
        domain_id=domain.id,
        username=username_for(who.workspace_id, domain.name),
        is_active=True,
        created_at=now,
    )
    smtp_credentials.insert(tx, credential, password_hash)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("smtp_credential.created", credential.username, credential.id),
        now,
    )
    return credential


async def create(rt: Runtime, who: Principal, domain_id: str) -> CreatedCredential:
    """A new credential for a verified domain of the workspace; the password is in the
    result only. NotFound (unknown or foreign domain), InvalidRequest (not verified),
    Conflict (an active one exists), PlanLimit (the plan's cap).
    """
    password = secrets.token_urlsafe(_PASSWORD_BYTES)
    credential = await rt.db.write(_insert, who, domain_id, token_hash(password), rt.clock.now())
    return CreatedCredential(credential, password)


async def list_all(rt: Runtime, who: Principal) -> list[SmtpCredential]:
    """Every credential of the workspace; deactivated ones too, with is_active false."""
    return await rt.db.read(smtp_credentials.list_all, who.workspace_id)


def _deactivate(tx: Tx, who: Principal, credential_id: str, now: datetime) -> None:
    credential = smtp_credentials.get(tx, who.workspace_id, credential_id)
    if credential is None:
        raise NotFound("SMTP credential not found")
    if smtp_credentials.deactivate(tx, who.workspace_id, credential_id, now):
        record(
            tx,
            who.workspace_id,
            who.user_email,
            Change("smtp_credential.deleted", credential.username, credential.id),
            now,
        )


async def delete(rt: Runtime, who: Principal, credential_id: str) -> None:
    """Deactivate a credential for good (again: nothing changes); NotFound if unknown."""
    await rt.db.write(_deactivate, who, credential_id, rt.clock.now())


def match(candidates: list[RelayLogin], password: str) -> RelayLogin | None:
    """The candidate whose hash `password` matches (compared in constant time), or None."""
    offered = token_hash(password)
    found = None
    for login in candidates:  # compare against every candidate: the time says nothing
        if same(login.password_hash, offered) and found is None:
            found = login
    return found


def usable_username(username: str) -> str | None:
    """The username as stored (lower case), or None when it cannot be one."""
    if not username or len(username) > _MAX_USERNAME:
        return None
    return username.lower()
