"""SMTP relay credentials: one active per domain, the password stored only as a hash.

A credential is never deleted: deactivating it is irreversible and it stays listed with
`is_active` false. The relay finds credentials by username (not unique across time: a
deactivated one keeps its name) together with what it needs to authorise the session, and
re-reads a session's credential by id to learn that it was deactivated on any node.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_timestamp, timestamp
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class SmtpCredential:
    id: str
    workspace_id: str
    domain_id: str
    username: str
    is_active: bool
    created_at: datetime


@dataclass(frozen=True, slots=True)
class RelayLogin:
    """An active credential as the relay sees it: its hash, domain and the workspace's plan."""

    credential_id: str
    password_hash: str
    workspace_id: str
    plan: str
    domain_id: str
    domain_name: str
    domain_verified: bool


def _credential(row: Row) -> SmtpCredential:
    return SmtpCredential(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        username=row["username"],
        is_active=bool(row["is_active"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(tx: Tx, credential: SmtpCredential, password_hash: str) -> None:
    tx.execute(
        "INSERT INTO smtp_credentials (id, workspace_id, domain_id, username, password_hash,"
        " is_active, created_at) VALUES (:id, :ws, :domain_id, :username, :hash, TRUE,"
        " :created_at)",
        {
            "id": credential.id,
            "ws": credential.workspace_id,
            "domain_id": credential.domain_id,
            "username": credential.username,
            "hash": password_hash,
            "created_at": timestamp(credential.created_at),
        },
    )


def count_active(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value(
            "SELECT COUNT(*) FROM smtp_credentials WHERE workspace_id = :ws AND is_active",
            {"ws": workspace_id},
        )
    )


def active_for_domain(tx: Tx, domain_id: str) -> SmtpCredential | None:
    row = tx.one(
        "SELECT * FROM smtp_credentials WHERE domain_id = :domain_id AND is_active",
        {"domain_id": domain_id},
    )
    return None if row is None else _credential(row)


def list_all(tx: Tx, workspace_id: str) -> list[SmtpCredential]:
    """Every credential of the workspace, active or not, oldest first."""
    rows = tx.all(
        "SELECT * FROM smtp_credentials WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_credential(row) for row in rows]


def get(tx: Tx, workspace_id: str, credential_id: str) -> SmtpCredential | None:
    row = tx.one(
        "SELECT * FROM smtp_credentials WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": credential_id},
    )
    return None if row is None else _credential(row)


def deactivate(tx: Tx, workspace_id: str, credential_id: str, now: datetime) -> bool:
    """Deactivate an active credential; False when it is unknown or already deactivated."""
    changed = tx.execute(
        "UPDATE smtp_credentials SET is_active = FALSE, deactivated_at = :now"
        " WHERE workspace_id = :ws AND id = :id AND is_active",
        {"now": timestamp(now), "ws": workspace_id, "id": credential_id},
    )
    return changed == 1


def revoke_for_domain(tx: Tx, domain_id: str, now: datetime) -> int:
    """Deactivate every active credential of a domain (it changes hands); how many."""
    return tx.execute(
        "UPDATE smtp_credentials SET is_active = FALSE, deactivated_at = :now"
        " WHERE domain_id = :domain_id AND is_active",
        {"now": timestamp(now), "domain_id": domain_id},
    )


# A login: an active credential joined to its domain (gone: no row) and workspace plan.
_LOGIN = (
    "SELECT c.id, c.password_hash, c.workspace_id, w.plan, c.domain_id, d.name, d.status"
    " FROM smtp_credentials c JOIN workspaces w ON w.id = c.workspace_id"
    " JOIN domains d ON d.id = c.domain_id AND d.workspace_id = c.workspace_id"
    " WHERE c.is_active"
)


def _login(row: Row) -> RelayLogin:
    return RelayLogin(
        credential_id=row["id"],
        password_hash=row["password_hash"],
        workspace_id=row["workspace_id"],
        plan=row["plan"],
        domain_id=row["domain_id"],
        domain_name=row["name"],
        domain_verified=row["status"] == "verified",
    )


def logins(tx: Tx, username: str) -> list[RelayLogin]:
    """The active credentials called `username`, with their domain and workspace plan.

    A credential whose domain was deleted has no login. Usually one; more only if two
    workspaces whose ids share 8 characters hold credentials for the same domain name.
    """
    rows = tx.all(_LOGIN + " AND c.username = :username", {"username": username})
    return [_login(row) for row in rows]


def login(tx: Tx, credential_id: str) -> RelayLogin | None:
    """The credential's login as it is now (by primary key: an open relay session re-reads
    it), or None once it is deactivated or its domain is gone."""
    row = tx.one(_LOGIN + " AND c.id = :id", {"id": credential_id})
    return None if row is None else _login(row)
