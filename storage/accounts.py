"""Users, workspaces, memberships, sessions and the service's own secrets.

The service's secrets are sealed at rest (storage.sealing): callers see them in clear.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.sealing import SERVICE_SECRET
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class User:
    id: str
    email: str
    password_hash: str
    is_admin: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Workspace:
    id: str
    name: str
    plan: str
    owner_user_id: str
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    user_id: str
    expires_at: datetime
    reauth_until: datetime | None
    revoked: bool


def _user(row: Row) -> User:
    return User(
        id=row["id"],
        email=row["email"],
        password_hash=row["password_hash"],
        is_admin=bool(row["is_admin"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def _workspace(row: Row) -> Workspace:
    return Workspace(
        id=row["id"],
        name=row["name"],
        plan=row["plan"],
        owner_user_id=row["owner_user_id"],
        created_at=parse_timestamp(row["created_at"]),
    )


def insert_user(tx: Tx, user: User) -> None:
    tx.execute(
        "INSERT INTO users (id, email, password_hash, is_admin, created_at)"
        " VALUES (:id, :email, :password_hash, :is_admin, :created_at)",
        {
            "id": user.id,
            "email": user.email,
            "password_hash": user.password_hash,
            "is_admin": user.is_admin,
            "created_at": timestamp(user.created_at),
        },
    )


def insert_workspace(tx: Tx, workspace: Workspace) -> None:
    """Insert a workspace with its owner as its first member."""
    created = timestamp(workspace.created_at)
    tx.execute(
        "INSERT INTO workspaces (id, name, plan, owner_user_id, created_at)"
        " VALUES (:id, :name, :plan, :owner, :created_at)",
        {
            "id": workspace.id,
            "name": workspace.name,
            "plan": workspace.plan,
            "owner": workspace.owner_user_id,
            "created_at": created,
        },
    )
    tx.execute(
        "INSERT INTO workspace_members (workspace_id, user_id, role, created_at)"
        " VALUES (:workspace_id, :user_id, 'owner', :created_at)",
        {"workspace_id": workspace.id, "user_id": workspace.owner_user_id, "created_at": created},
    )


def user_by_email(tx: Tx, email: str) -> User | None:
    row = tx.one("SELECT * FROM users WHERE email = :email", {"email": email})
    return None if row is None else _user(row)


# Serialises first-run set-ups on PostgreSQL (SQLite has one writer already).
_FIRST_USER_LOCK = 0x706F737472300001


def has_users(tx: Tx, *, lock: bool = False) -> bool:
    """Whether any user exists; with `lock`, two set-ups racing on an empty database are
    taken one after the other, so only one first user is ever made."""
    if lock and tx.dialect == "postgresql":
        tx.execute(f"SELECT pg_advisory_xact_lock({_FIRST_USER_LOCK})")
    return tx.value("SELECT 1 FROM users LIMIT 1") is not None


def hold_workspace(tx: Tx, workspace_id: str) -> None:
    """Hold the workspace's row until commit on PostgreSQL (SQLite has one writer): writes
    that count its things before adding one (a plan's limits), or change who owns it, take
    turns, on one node's writers as across nodes, each seeing what the one before added."""
    if tx.dialect == "postgresql":
        tx.execute("SELECT id FROM workspaces WHERE id = :ws FOR UPDATE", {"ws": workspace_id})


def user_by_id(tx: Tx, user_id: str) -> User | None:
    row = tx.one("SELECT * FROM users WHERE id = :id", {"id": user_id})
    return None if row is None else _user(row)


def workspaces_of(tx: Tx, user_id: str) -> list[Workspace]:
    """The workspaces a user belongs to, oldest first."""
    rows = tx.all(
        "SELECT w.* FROM workspaces w JOIN workspace_members m ON m.workspace_id = w.id"
        " WHERE m.user_id = :user_id ORDER BY w.created_at, w.id",
        {"user_id": user_id},
    )
    return [_workspace(row) for row in rows]


@dataclass(frozen=True, slots=True)
class Membership:
    workspace: Workspace
    role: str


def memberships_of(tx: Tx, user_id: str) -> list[Membership]:
    """The workspaces a user belongs to with the user's role in each, oldest first."""
    rows = tx.all(
        "SELECT w.*, m.role AS member_role FROM workspaces w"
        " JOIN workspace_members m ON m.workspace_id = w.id"
        " WHERE m.user_id = :user_id ORDER BY w.created_at, w.id",
        {"user_id": user_id},
    )
    return [Membership(_workspace(row), row["member_role"]) for row in rows]


def owned_workspaces(tx: Tx, user_id: str) -> list[Workspace]:
    rows = tx.all(
        "SELECT * FROM workspaces WHERE owner_user_id = :user_id ORDER BY created_at, id",
        {"user_id": user_id},
    )
    return [_workspace(row) for row in rows]


def set_plan(tx: Tx, workspace_id: str, plan: str) -> None:
    tx.execute(
        "UPDATE workspaces SET plan = :plan WHERE id = :id", {"plan": plan, "id": workspace_id}
    )


def insert_session(tx: Tx, session: Session, created_at: datetime) -> None:
    tx.execute(
        "INSERT INTO sessions (id, user_id, created_at, expires_at)"
        " VALUES (:id, :user_id, :created_at, :expires_at)",
        {
            "id": session.id,
            "user_id": session.user_id,
            "created_at": timestamp(created_at),
            "expires_at": timestamp(session.expires_at),
        },
    )


def session_by_id(tx: Tx, session_id: str) -> Session | None:
    row = tx.one("SELECT * FROM sessions WHERE id = :id", {"id": session_id})
    if row is None:
        return None
    return Session(
        id=row["id"],
        user_id=row["user_id"],
        expires_at=parse_timestamp(row["expires_at"]),
        reauth_until=parse_optional_timestamp(row["reauth_until"]),
        revoked=row["revoked_at"] is not None,
    )


def revoke_session(tx: Tx, session_id: str, at: datetime) -> None:
    tx.execute(
        "UPDATE sessions SET revoked_at = :at WHERE id = :id AND revoked_at IS NULL",
        {"at": timestamp(at), "id": session_id},
    )


def set_password(tx: Tx, user_id: str, password_hash: str) -> None:
    tx.execute(
        "UPDATE users SET password_hash = :hash WHERE id = :id",
        {"hash": password_hash, "id": user_id},
    )


def revoke_other_sessions(tx: Tx, user_id: str, keep: str | None, at: datetime) -> None:
    """End every open session of the user but `keep` (the one that changed the password)."""
    tx.execute(
        "UPDATE sessions SET revoked_at = :at WHERE user_id = :user_id AND revoked_at IS NULL"
        " AND id <> :keep",
        {"at": timestamp(at), "user_id": user_id, "keep": keep or ""},
    )


def mark_reauthenticated(tx: Tx, session_id: str, until: datetime) -> None:
    tx.execute(
        "UPDATE sessions SET reauth_until = :until WHERE id = :id",
        {"until": timestamp(until), "id": session_id},
    )


def secret(tx: Tx, name: str, generated: str) -> str:
    """The stored secret called `name`, storing `generated` first if there is none."""
    tx.execute(
        "INSERT INTO service_secrets (name, value) VALUES (:name, :value)"
        " ON CONFLICT (name) DO NOTHING",
        {"name": name, "value": tx.sealer.seal(SERVICE_SECRET, name, generated)},
    )
    stored: str = tx.value("SELECT value FROM service_secrets WHERE name = :name", {"name": name})
    return tx.sealer.unseal(SERVICE_SECRET, name, stored)
