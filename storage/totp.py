"""Two-factor sign-in at rest: each user's TOTP secret (sealed), the hashes of their recovery
codes, and which workspaces require two-factor sign-in of their members."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, timestamp
from storage.sealing import TOTP_SECRET
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Totp:
    """A user's TOTP secret (opened) and whether it is confirmed."""

    user_id: str
    secret: str
    confirmed_at: datetime | None
    last_step: int


def of_user(tx: Tx, user_id: str, *, lock: bool = False) -> Totp | None:
    """The user's TOTP enrolment, confirmed or not; with `lock`, held until commit, so two
    codes checked at once are taken one after the other (no replay between them)."""
    row = tx.one(
        "SELECT user_id, secret, confirmed_at, last_step FROM user_totp WHERE user_id = :user"
        + tx.row_lock(when=lock),
        {"user": user_id},
    )
    if row is None:
        return None
    return Totp(
        user_id=row["user_id"],
        secret=tx.sealer.unseal(TOTP_SECRET, row["user_id"], row["secret"]),
        confirmed_at=parse_optional_timestamp(row["confirmed_at"]),
        last_step=int(row["last_step"]),
    )


def is_enabled(tx: Tx, user_id: str) -> bool:
    """Whether the user signs in with a second factor (a confirmed enrolment)."""
    found = tx.value(
        "SELECT 1 FROM user_totp WHERE user_id = :user AND confirmed_at IS NOT NULL",
        {"user": user_id},
    )
    return found is not None


def start(tx: Tx, user_id: str, secret: str, at: datetime) -> None:
    """A new, unconfirmed enrolment with `secret`, in place of an unconfirmed one."""
    tx.execute("DELETE FROM user_totp WHERE user_id = :user", {"user": user_id})
    tx.execute(
        "INSERT INTO user_totp (user_id, secret, created_at, confirmed_at, last_step)"
        " VALUES (:user, :secret, :at, NULL, 0)",
        {
            "user": user_id,
            "secret": tx.sealer.seal(TOTP_SECRET, user_id, secret),
            "at": timestamp(at),
        },
    )


def confirm(tx: Tx, user_id: str, step: int, at: datetime, code_hashes: Sequence[str]) -> None:
    """Confirm the enrolment (its first code was for `step`) with fresh recovery codes."""
    tx.execute(
        "UPDATE user_totp SET confirmed_at = :at, last_step = :step WHERE user_id = :user",
        {"user": user_id, "at": timestamp(at), "step": step},
    )
    tx.execute("DELETE FROM totp_recovery_codes WHERE user_id = :user", {"user": user_id})
    tx.execute_many(
        "INSERT INTO totp_recovery_codes (user_id, code_hash, used_at) VALUES (:user, :hash, NULL)",
        [{"user": user_id, "hash": code_hash} for code_hash in code_hashes],
    )


def accept_step(tx: Tx, user_id: str, step: int) -> bool:
    """Record that a code for `step` was accepted; False if one for it or a later step was
    accepted already (the code is a replay)."""
    changed = tx.execute(
        "UPDATE user_totp SET last_step = :step WHERE user_id = :user AND last_step < :step",
        {"user": user_id, "step": step},
    )
    return changed == 1


def use_recovery_code(tx: Tx, user_id: str, code_hash: str, at: datetime) -> bool:
    """Spend an unused recovery code; False if the user has no such unused code."""
    changed = tx.execute(
        "UPDATE totp_recovery_codes SET used_at = :at"
        " WHERE user_id = :user AND code_hash = :hash AND used_at IS NULL",
        {"user": user_id, "hash": code_hash, "at": timestamp(at)},
    )
    return changed == 1


def recovery_codes_left(tx: Tx, user_id: str) -> int:
    return int(
        tx.value(
            "SELECT COUNT(*) FROM totp_recovery_codes WHERE user_id = :user AND used_at IS NULL",
            {"user": user_id},
        )
    )


def remove(tx: Tx, user_id: str) -> None:
    """Forget the user's enrolment and recovery codes."""
    tx.execute("DELETE FROM totp_recovery_codes WHERE user_id = :user", {"user": user_id})
    tx.execute("DELETE FROM user_totp WHERE user_id = :user", {"user": user_id})


def is_required(tx: Tx, workspace_id: str) -> bool:
    """Whether the workspace requires two-factor sign-in of its members."""
    found = tx.value(
        "SELECT 1 FROM workspace_totp_required WHERE workspace_id = :ws", {"ws": workspace_id}
    )
    return found is not None


def set_required(tx: Tx, workspace_id: str, required: bool, by: str, at: datetime) -> bool:
    """Require two-factor sign-in in the workspace or stop requiring it; whether that changed."""
    if not required:
        return (
            tx.execute(
                "DELETE FROM workspace_totp_required WHERE workspace_id = :ws", {"ws": workspace_id}
            )
            == 1
        )
    if is_required(tx, workspace_id):
        return False
    tx.execute(
        "INSERT INTO workspace_totp_required (workspace_id, required_by, required_at)"
        " VALUES (:ws, :by, :at)",
        {"ws": workspace_id, "by": by, "at": timestamp(at)},
    )
    return True


def required_workspaces(tx: Tx, user_id: str) -> frozenset[str]:
    """The workspaces of which the user is a member that require two-factor sign-in."""
    rows = tx.all(
        "SELECT r.workspace_id FROM workspace_totp_required r"
        " JOIN workspace_members m ON m.workspace_id = r.workspace_id WHERE m.user_id = :user",
        {"user": user_id},
    )
    return frozenset(row["workspace_id"] for row in rows)
