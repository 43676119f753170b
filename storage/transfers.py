"""Domain transfers, the initiation attempts of the rate limit, and moving a domain.

State changes are conditional updates (`WHERE status = :from`) that report whether they
happened, so two nodes (or a timer racing a user) never apply one transition twice.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.sealing import DKIM_PRIVATE_KEY, ED25519_PRIVATE_KEY
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Transfer:
    id: str
    domain_id: str
    domain_name: str
    source_user_id: str
    source_org_id: str
    source_label: str
    target_email: str
    target_user_id: str | None
    target_org_id: str | None
    status: str
    note: str
    rotate_dkim: bool
    forced_by: str | None
    cooloff_until: datetime | None
    initiated_at: datetime
    accepted_at: datetime | None
    completed_at: datetime | None
    ended_at: datetime | None
    expires_at: datetime


def _transfer(row: Row) -> Transfer:
    return Transfer(
        id=row["id"],
        domain_id=row["domain_id"],
        domain_name=row["domain_name"],
        source_user_id=row["source_user_id"],
        source_org_id=row["source_org_id"],
        source_label=row["source_label"],
        target_email=row["target_email"],
        target_user_id=row["target_user_id"],
        target_org_id=row["target_org_id"],
        status=row["status"],
        note=row["note"],
        rotate_dkim=bool(row["rotate_dkim"]),
        forced_by=row["forced_by"],
        cooloff_until=parse_optional_timestamp(row["cooloff_until"]),
        initiated_at=parse_timestamp(row["initiated_at"]),
        accepted_at=parse_optional_timestamp(row["accepted_at"]),
        completed_at=parse_optional_timestamp(row["completed_at"]),
        ended_at=parse_optional_timestamp(row["ended_at"]),
        expires_at=parse_timestamp(row["expires_at"]),
    )


def _optional(value: datetime | None) -> str | None:
    return None if value is None else timestamp(value)


def insert(tx: Tx, t: Transfer, accept_token_hash: str | None) -> None:
    tx.execute(
        "INSERT INTO domain_transfers (id, domain_id, domain_name, source_user_id,"
        " source_org_id, source_label, target_email, target_user_id, target_org_id, status,"
        " note, rotate_dkim, forced_by, accept_token_hash, cooloff_until, initiated_at,"
        " accepted_at, completed_at, ended_at, expires_at) VALUES (:id, :domain_id,"
        " :domain_name, :source_user_id, :source_org_id, :source_label, :target_email,"
        " :target_user_id, :target_org_id, :status, :note, :rotate_dkim, :forced_by,"
        " :accept_token_hash, :cooloff_until, :initiated_at, :accepted_at, :completed_at,"
        " :ended_at, :expires_at)",
        {
            "id": t.id,
            "domain_id": t.domain_id,
            "domain_name": t.domain_name,
            "source_user_id": t.source_user_id,
            "source_org_id": t.source_org_id,
            "source_label": t.source_label,
            "target_email": t.target_email,
            "target_user_id": t.target_user_id,
            "target_org_id": t.target_org_id,
            "status": t.status,
            "note": t.note,
            "rotate_dkim": t.rotate_dkim,
            "forced_by": t.forced_by,
            "accept_token_hash": accept_token_hash,
            "cooloff_until": _optional(t.cooloff_until),
            "initiated_at": timestamp(t.initiated_at),
            "accepted_at": _optional(t.accepted_at),
            "completed_at": _optional(t.completed_at),
            "ended_at": _optional(t.ended_at),
            "expires_at": timestamp(t.expires_at),
        },
    )


def get(tx: Tx, transfer_id: str) -> Transfer | None:
    row = tx.one("SELECT * FROM domain_transfers WHERE id = :id", {"id": transfer_id})
    return None if row is None else _transfer(row)


def by_accept_token(tx: Tx, token_hash: str) -> Transfer | None:
    row = tx.one("SELECT * FROM domain_transfers WHERE accept_token_hash = :h", {"h": token_hash})
    return None if row is None else _transfer(row)


def by_stop_token(tx: Tx, token_hash: str) -> Transfer | None:
    row = tx.one("SELECT * FROM domain_transfers WHERE stop_token_hash = :h", {"h": token_hash})
    return None if row is None else _transfer(row)


def active_for_domain(tx: Tx, domain_id: str) -> list[Transfer]:
    """The domain's pending or accepted transfers (at most one, by a unique index)."""
    rows = tx.all(
        "SELECT * FROM domain_transfers WHERE domain_id = :d AND status IN ('pending', 'accepted')",
        {"d": domain_id},
    )
    return [_transfer(row) for row in rows]


def incoming(tx: Tx, target_email: str) -> list[Transfer]:
    """Pending or accepted transfers addressed to an email, most recent first."""
    rows = tx.all(
        "SELECT * FROM domain_transfers WHERE target_email = :email"
        " AND status IN ('pending', 'accepted') ORDER BY initiated_at DESC, id DESC",
        {"email": target_email},
    )
    return [_transfer(row) for row in rows]


def outgoing(tx: Tx, source_user_id: str) -> list[Transfer]:
    """Transfers a user initiated, most recent first."""
    rows = tx.all(
        "SELECT * FROM domain_transfers WHERE source_user_id = :user AND forced_by IS NULL"
        " ORDER BY initiated_at DESC, id DESC",
        {"user": source_user_id},
    )
    return [_transfer(row) for row in rows]


def set_accepted(
    tx: Tx,
    transfer_id: str,
    target_user_id: str,
    target_org_id: str,
    rotate_dkim: bool,
    stop_token_hash: str,
    accepted_at: datetime,
    cooloff_until: datetime,
) -> bool:
    """pending -> accepted, using up the accept token; False if it was no longer pending."""
    return (
        tx.execute(
            "UPDATE domain_transfers SET status = 'accepted', target_user_id = :user,"
            " target_org_id = :org, rotate_dkim = :rotate, stop_token_hash = :stop,"
            " accept_token_hash = NULL, accepted_at = :at, cooloff_until = :until"
            " WHERE id = :id AND status = 'pending'",
            {
                "user": target_user_id,
                "org": target_org_id,
                "rotate": rotate_dkim,
                "stop": stop_token_hash,
                "at": timestamp(accepted_at),
                "until": timestamp(cooloff_until),
                "id": transfer_id,
            },
        )
        == 1
    )


def set_ended(tx: Tx, transfer_id: str, from_status: str, to_status: str, at: datetime) -> bool:
    """A transition that ends the transfer without moving the domain; False if it lost a race.

    A stop uses up the stop token (`reversed`), so a second use of it finds nothing.
    """
    clear_stop = ", stop_token_hash = NULL" if to_status == "reversed" else ""
    return (
        tx.execute(
            f"UPDATE domain_transfers SET status = :to, ended_at = :at{clear_stop}"
            " WHERE id = :id AND status = :from",
            {"to": to_status, "at": timestamp(at), "id": transfer_id, "from": from_status},
        )
        == 1
    )


def set_completed(tx: Tx, transfer_id: str, at: datetime) -> bool:
    """accepted -> completed; False if another node (or a stop) got there first."""
    return (
        tx.execute(
            "UPDATE domain_transfers SET status = 'completed', completed_at = :at"
            " WHERE id = :id AND status = 'accepted'",
            {"at": timestamp(at), "id": transfer_id},
        )
        == 1
    )


def due(tx: Tx, now: datetime, limit: int) -> list[Transfer]:
    """Pending transfers past their expiry and accepted ones past their safety window."""
    at = timestamp(now)
    rows = tx.all(
        "SELECT * FROM domain_transfers WHERE (status = 'pending' AND expires_at <= :now)"
        " OR (status = 'accepted' AND cooloff_until <= :now)"
        " ORDER BY initiated_at, id LIMIT :limit",
        {"now": at, "limit": limit},
    )
    return [_transfer(row) for row in rows]


def next_deadline(tx: Tx) -> datetime | None:
    """The earliest expiry of a pending transfer or end of an accepted one's window."""
    expiry = tx.value("SELECT MIN(expires_at) FROM domain_transfers WHERE status = 'pending'")
    window = tx.value("SELECT MIN(cooloff_until) FROM domain_transfers WHERE status = 'accepted'")
    found = [parse_timestamp(v) for v in (expiry, window) if v is not None]
    return min(found) if found else None


def note_initiation(tx: Tx, user_id: str, now: datetime, window_start: datetime) -> list[datetime]:
    """Forget attempts older than the window; the user's remaining attempts, oldest first."""
    tx.execute(
        "DELETE FROM transfer_initiations WHERE user_id = :user AND attempted_at <= :start",
        {"user": user_id, "start": timestamp(window_start)},
    )
    rows = tx.all(
        "SELECT attempted_at FROM transfer_initiations WHERE user_id = :user ORDER BY attempted_at",
        {"user": user_id},
    )
    return [parse_timestamp(row["attempted_at"]) for row in rows]


def add_initiation(tx: Tx, user_id: str, at: datetime) -> None:
    tx.execute(
        "INSERT INTO transfer_initiations (user_id, attempted_at) VALUES (:user, :at)",
        {"user": user_id, "at": timestamp(at)},
    )


def scheduled_email_count(tx: Tx, workspace_id: str, domain_id: str) -> int:
    """The domain's emails still waiting for their send_at."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM emails WHERE workspace_id = :ws AND domain_id = :d"
            " AND status = 'scheduled'",
            {"ws": workspace_id, "d": domain_id},
        )
    )


@dataclass(frozen=True, slots=True)
class NewDkimKey:
    """A transferred domain's new DKIM keys: its RSA key, and the Ed25519 key that replaces
    the one it signs with beside RSA (a domain without one is given none)."""

    selector: str
    private_pem: str
    public_b64: str
    ed25519_selector: str
    ed25519_private_pem: str
    ed25519_public_b64: str


def move_domain(
    tx: Tx, domain_id: str, to_workspace_id: str, new_key: NewDkimKey | None, now: datetime
) -> list[tuple[str, str]]:
    """Move a domain with its senders (and BIMI settings, which are its columns) to a workspace.

    A same-named registration the target made meanwhile is removed first: only one of the
    two can ever be verified and the transferred one replaces it. With new DKIM keys (its
    Ed25519 key replaced only if it has one) the domain is pending again until its new
    records are found. Returns the removed duplicates as (id, name).
    """
    duplicates = tx.all(
        "SELECT id, name FROM domains WHERE workspace_id = :ws AND id <> :id"
        " AND name = (SELECT name FROM domains WHERE id = :id)",
        {"ws": to_workspace_id, "id": domain_id},
    )
    for row in duplicates:
        tx.execute("DELETE FROM senders WHERE domain_id = :id", {"id": row["id"]})
        tx.execute("DELETE FROM domains WHERE id = :id", {"id": row["id"]})
    tx.execute(
        "UPDATE domains SET workspace_id = :ws WHERE id = :id",
        {"ws": to_workspace_id, "id": domain_id},
    )
    tx.execute(
        "UPDATE senders SET workspace_id = :ws WHERE domain_id = :id",
        {"ws": to_workspace_id, "id": domain_id},
    )
    if new_key is not None:
        tx.execute(
            "UPDATE domains SET dkim_selector = :selector, dkim_private_key = :private,"
            " dkim_public_key = :public, status = 'pending', record_status = '{}',"
            " record_findings = '{}',"
            " verified_at = NULL, checked_at = NULL, pending_since = :now WHERE id = :id",
            {
                "now": timestamp(now),
                "selector": new_key.selector,
                "private": tx.sealer.seal(DKIM_PRIVATE_KEY, domain_id, new_key.private_pem),
                "public": new_key.public_b64,
                "id": domain_id,
            },
        )
        tx.execute(
            "UPDATE domains SET ed25519_selector = :selector, ed25519_private_key = :private,"
            " ed25519_public_key = :public WHERE id = :id AND ed25519_private_key IS NOT NULL",
            {
                "selector": new_key.ed25519_selector,
                "private": tx.sealer.seal(
                    ED25519_PRIVATE_KEY, domain_id, new_key.ed25519_private_pem
                ),
                "public": new_key.ed25519_public_b64,
                "id": domain_id,
            },
        )
    return [(row["id"], row["name"]) for row in duplicates]


def member_of(tx: Tx, user_id: str, workspace_id: str) -> bool:
    return (
        tx.value(
            "SELECT 1 FROM workspace_members WHERE user_id = :user AND workspace_id = :ws",
            {"user": user_id, "ws": workspace_id},
        )
        is not None
    )


def workspace_owner(tx: Tx, workspace_id: str) -> tuple[str, str]:
    """The owner of a workspace: (user id, email)."""
    row = tx.one(
        "SELECT u.id, u.email FROM workspaces w JOIN users u ON u.id = w.owner_user_id"
        " WHERE w.id = :ws",
        {"ws": workspace_id},
    )
    assert row is not None, "every workspace has an owner"
    return row["id"], row["email"]


@dataclass(frozen=True, slots=True)
class SystemIdentity:
    """The hidden user, workspace and domain the service's own mail is sent from."""

    user_id: str
    user_email: str
    workspace_id: str
    workspace_name: str
    domain_id: str
    domain_name: str
    dkim_selector: str
    dkim_private_key: str
    dkim_public_key: str


def system_domain_exists(tx: Tx, domain_id: str) -> bool:
    return tx.value("SELECT 1 FROM domains WHERE id = :id", {"id": domain_id}) is not None


def ensure_system_identity(tx: Tx, s: SystemIdentity, now: datetime) -> bool:
    """Create whatever part of the system identity is missing; whether the domain was new.

    Every insert yields to an existing row, so nodes racing on first use agree on one.
    """
    at = timestamp(now)
    # An unusable password hash: no one can log in as the system user.
    tx.execute(
        "INSERT INTO users (id, email, password_hash, is_admin, created_at)"
        " VALUES (:id, :email, '!', FALSE, :at) ON CONFLICT DO NOTHING",
        {"id": s.user_id, "email": s.user_email, "at": at},
    )
    tx.execute(
        "INSERT INTO workspaces (id, name, plan, owner_user_id, created_at)"
        " VALUES (:id, :name, 'business', :user, :at) ON CONFLICT DO NOTHING",
        {"id": s.workspace_id, "name": s.workspace_name, "user": s.user_id, "at": at},
    )
    return (
        tx.execute(
            "INSERT INTO domains (id, workspace_id, name, status, dkim_selector,"
            " dkim_private_key, dkim_public_key, record_status, created_at)"
            " VALUES (:id, :ws, :name, 'system', :selector, :private, :public, '{}', :at)"
            " ON CONFLICT DO NOTHING",
            {
                "id": s.domain_id,
                "ws": s.workspace_id,
                "name": s.domain_name,
                "selector": s.dkim_selector,
                "private": tx.sealer.seal(DKIM_PRIVATE_KEY, s.domain_id, s.dkim_private_key),
                "public": s.dkim_public_key,
                "at": at,
            },
        )
        == 1
    )
