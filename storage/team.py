"""A workspace's members and the invitations to join it."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.accounts import hold_workspace
from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Member:
    user_id: str
    email: str
    role: str
    joined_at: datetime


@dataclass(frozen=True, slots=True)
class Invitation:
    id: str
    workspace_id: str
    email: str
    role: str
    invited_by: str
    created_at: datetime
    expires_at: datetime
    accepted_at: datetime | None
    revoked_at: datetime | None


def _member(row: Row) -> Member:
    return Member(row["user_id"], row["email"], row["role"], parse_timestamp(row["created_at"]))


def _invitation(row: Row) -> Invitation:
    return Invitation(
        id=row["id"],
        workspace_id=row["workspace_id"],
        email=row["email"],
        role=row["role"],
        invited_by=row["invited_by"],
        created_at=parse_timestamp(row["created_at"]),
        expires_at=parse_timestamp(row["expires_at"]),
        accepted_at=parse_optional_timestamp(row["accepted_at"]),
        revoked_at=parse_optional_timestamp(row["revoked_at"]),
    )


_MEMBERS = (
    "SELECT m.user_id, u.email, m.role, m.created_at FROM workspace_members m"
    " JOIN users u ON u.id = m.user_id WHERE m.workspace_id = :ws"
)


def members(tx: Tx, workspace_id: str) -> list[Member]:
    """The workspace's members, first joined first."""
    rows = tx.all(_MEMBERS + " ORDER BY m.created_at, m.user_id", {"ws": workspace_id})
    return [_member(row) for row in rows]


def member(tx: Tx, workspace_id: str, user_id: str, *, lock: bool = False) -> Member | None:
    """One member; with `lock`, the workspace's membership is held until commit, so two
    changes to who owns it are taken one after the other."""
    if lock:
        hold_workspace(tx, workspace_id)
    row = tx.one(_MEMBERS + " AND m.user_id = :user", {"ws": workspace_id, "user": user_id})
    return None if row is None else _member(row)


def add_member(tx: Tx, workspace_id: str, user_id: str, role: str, at: datetime) -> None:
    tx.execute(
        "INSERT INTO workspace_members (workspace_id, user_id, role, created_at)"
        " VALUES (:ws, :user, :role, :at)",
        {"ws": workspace_id, "user": user_id, "role": role, "at": timestamp(at)},
    )


def set_role(tx: Tx, workspace_id: str, user_id: str, role: str) -> None:
    tx.execute(
        "UPDATE workspace_members SET role = :role WHERE workspace_id = :ws AND user_id = :user",
        {"role": role, "ws": workspace_id, "user": user_id},
    )


def set_owner(tx: Tx, workspace_id: str, user_id: str) -> None:
    """Record `user_id` as the workspace's owner (the workspace row names its one owner)."""
    tx.execute(
        "UPDATE workspaces SET owner_user_id = :user WHERE id = :ws",
        {"user": user_id, "ws": workspace_id},
    )


def remove_member(tx: Tx, workspace_id: str, user_id: str) -> None:
    tx.execute(
        "DELETE FROM workspace_members WHERE workspace_id = :ws AND user_id = :user",
        {"ws": workspace_id, "user": user_id},
    )


def insert_invitation(tx: Tx, invitation: Invitation, token_hash: str) -> None:
    tx.execute(
        "INSERT INTO workspace_invitations (id, workspace_id, email, role, token_hash,"
        " invited_by, created_at, expires_at) VALUES (:id, :ws, :email, :role, :hash,"
        " :invited_by, :created_at, :expires_at)",
        {
            "id": invitation.id,
            "ws": invitation.workspace_id,
            "email": invitation.email,
            "role": invitation.role,
            "hash": token_hash,
            "invited_by": invitation.invited_by,
            "created_at": timestamp(invitation.created_at),
            "expires_at": timestamp(invitation.expires_at),
        },
    )


def pending_invitations(tx: Tx, workspace_id: str, now: datetime) -> list[Invitation]:
    """Invitations neither used, revoked nor expired, newest first."""
    rows = tx.all(
        "SELECT * FROM workspace_invitations WHERE workspace_id = :ws AND accepted_at IS NULL"
        " AND revoked_at IS NULL AND expires_at > :now ORDER BY created_at DESC, id",
        {"ws": workspace_id, "now": timestamp(now)},
    )
    return [_invitation(row) for row in rows]


def invitation(tx: Tx, workspace_id: str, invitation_id: str) -> Invitation | None:
    row = tx.one(
        "SELECT * FROM workspace_invitations WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": invitation_id},
    )
    return None if row is None else _invitation(row)


def invitation_by_id(tx: Tx, invitation_id: str) -> Invitation | None:
    row = tx.one("SELECT * FROM workspace_invitations WHERE id = :id", {"id": invitation_id})
    return None if row is None else _invitation(row)


def pending_for(tx: Tx, email: str, now: datetime) -> list[tuple[Invitation, str]]:
    """Invitations addressed to `email` still open, each with its workspace's name."""
    rows = tx.all(
        "SELECT i.*, w.name AS workspace_name FROM workspace_invitations i"
        " JOIN workspaces w ON w.id = i.workspace_id WHERE i.email = :email"
        " AND i.accepted_at IS NULL AND i.revoked_at IS NULL AND i.expires_at > :now"
        " ORDER BY i.created_at DESC, i.id",
        {"email": email, "now": timestamp(now)},
    )
    return [(_invitation(row), row["workspace_name"]) for row in rows]


def invitation_by_token(tx: Tx, token_hash: str) -> Invitation | None:
    row = tx.one(
        "SELECT * FROM workspace_invitations WHERE token_hash = :hash", {"hash": token_hash}
    )
    return None if row is None else _invitation(row)


def mark_accepted(tx: Tx, invitation_id: str, at: datetime) -> bool:
    """Use the invitation; False when it was used or revoked meanwhile (single use)."""
    changed = tx.execute(
        "UPDATE workspace_invitations SET accepted_at = :at WHERE id = :id"
        " AND accepted_at IS NULL AND revoked_at IS NULL",
        {"at": timestamp(at), "id": invitation_id},
    )
    return changed == 1


def mark_revoked(tx: Tx, invitation_id: str, at: datetime) -> bool:
    changed = tx.execute(
        "UPDATE workspace_invitations SET revoked_at = :at WHERE id = :id"
        " AND accepted_at IS NULL AND revoked_at IS NULL",
        {"at": timestamp(at), "id": invitation_id},
    )
    return changed == 1
