"""The per-workspace suppression list: addresses mail is never sent to."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import contains, parse_optional_timestamp, parse_timestamp, timestamp
from storage.engines import in_one_snapshot
from storage.privacy import address_hash, legacy_hash
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Suppression:
    email: str
    reason: str
    created_at: datetime
    source_email_id: str | None


# An unsubscribe blocks only the mail that offers one (engine/suppressions/scopes.py), less
# than any other reason: an entry of another reason replaces it, so a recipient who
# unsubscribed and then bounces or complains is not sent transactional mail any more.
NARROW = "unsubscribe"


def add(tx: Tx, workspace_id: str, entry: Suppression) -> bool:
    """Suppress an address; False when it was already suppressed (left unchanged), unless
    only by an unsubscribe that this entry, of another reason, replaces."""
    return (
        tx.execute(
            "INSERT INTO suppressions (workspace_id, email, reason, source_email_id, created_at)"
            " VALUES (:ws, :email, :reason, :source, :created_at)"
            " ON CONFLICT (workspace_id, email) DO UPDATE SET reason = excluded.reason,"
            " source_email_id = excluded.source_email_id, created_at = excluded.created_at"
            " WHERE suppressions.reason = :narrow AND excluded.reason <> :narrow",
            {
                "ws": workspace_id,
                "email": entry.email,
                "reason": entry.reason,
                "source": entry.source_email_id,
                "created_at": timestamp(entry.created_at),
                "narrow": NARROW,
            },
        )
        == 1
    )


def get(tx: Tx, workspace_id: str, email: str) -> Suppression | None:
    row = tx.one(
        "SELECT * FROM suppressions WHERE workspace_id = :ws AND email = :email",
        {"ws": workspace_id, "email": email},
    )
    if row is None:
        return None
    return Suppression(
        email=row["email"],
        reason=row["reason"],
        created_at=parse_timestamp(row["created_at"]),
        source_email_id=row["source_email_id"],
    )


@in_one_snapshot
def page(
    tx: Tx, workspace_id: str, offset: int, limit: int, search: str | None
) -> tuple[list[Suppression], int]:
    """A page of suppressions, newest first, and the total matching."""
    where = "workspace_id = :ws"
    params: dict[str, object] = {"ws": workspace_id, "limit": limit, "offset": offset}
    if search:
        where += " AND email LIKE :pattern ESCAPE '!'"
        params["pattern"] = contains(search.lower())
    total = int(tx.value(f"SELECT COUNT(*) FROM suppressions WHERE {where}", params))
    rows = tx.all(
        f"SELECT * FROM suppressions WHERE {where}"
        " ORDER BY created_at DESC, email LIMIT :limit OFFSET :offset",
        params,
    )
    items = [
        Suppression(
            email=row["email"],
            reason=row["reason"],
            created_at=parse_timestamp(row["created_at"]),
            source_email_id=row["source_email_id"],
        )
        for row in rows
    ]
    return items, total


def remove(tx: Tx, workspace_id: str, email: str) -> bool:
    """Lift a suppression; False when the address was not suppressed."""
    return (
        tx.execute(
            "DELETE FROM suppressions WHERE workspace_id = :ws AND email = :email",
            {"ws": workspace_id, "email": email},
        )
        == 1
    )


def overrides(
    tx: Tx, workspace_id: str, emails: list[str]
) -> dict[str, tuple[datetime, datetime | None]]:
    """The override windows of the given addresses: (rejected_at, used_at) by address."""
    found: dict[str, tuple[datetime, datetime | None]] = {}
    for email in emails:
        row = tx.one(
            "SELECT rejected_at, used_at FROM suppression_overrides"
            " WHERE workspace_id = :ws AND email = :email",
            {"ws": workspace_id, "email": email},
        )
        if row is not None:
            found[email] = (
                parse_timestamp(row["rejected_at"]),
                parse_optional_timestamp(row["used_at"]),
            )
    return found


def open_override_window(tx: Tx, workspace_id: str, email: str, at: datetime) -> None:
    tx.execute(
        "INSERT INTO suppression_overrides (workspace_id, email, rejected_at) VALUES (:ws, :email, :at)"
        " ON CONFLICT (workspace_id, email) DO UPDATE SET rejected_at = :at, used_at = NULL",
        {"ws": workspace_id, "email": email, "at": timestamp(at)},
    )


def use_override(tx: Tx, workspace_id: str, email: str, at: datetime) -> None:
    tx.execute(
        "UPDATE suppression_overrides SET used_at = :at WHERE workspace_id = :ws AND email = :email",
        {"ws": workspace_id, "email": email, "at": timestamp(at)},
    )


_CHUNK = 250  # addresses per IN list (three entries each): inside both engines' limits
# The reason `suppressed_among` gives an erased address, whatever reason its entry kept:
# erasure is final (engine/suppressions/override.py never lifts it).
ERASED = "erased"


def suppressed_among(tx: Tx, workspace_id: str, emails: list[str]) -> dict[str, str]:
    """Which of the addresses are suppressed, with the reason (`ERASED` for an erased one):
    one query per 250 addresses."""
    found: dict[str, str] = {}
    for start in range(0, len(emails), _CHUNK):
        chunk = emails[start : start + _CHUNK]
        # An erased address is kept only as its hash (storage/privacy.py), keyed or, from
        # earlier releases, plain: look for all three.
        hashed = {address_hash(tx, workspace_id, email): email for email in chunk}
        hashed.update({legacy_hash(workspace_id, email): email for email in chunk})
        names = {f"e{i}": email for i, email in enumerate([*chunk, *hashed])}
        placeholders = ", ".join(f":{name}" for name in names)
        for row in tx.all(
            "SELECT email, reason FROM suppressions WHERE workspace_id = :ws"
            f" AND email IN ({placeholders})",
            {"ws": workspace_id, **names},
        ):
            stored = str(row["email"])
            if stored in hashed:
                found[hashed[stored]] = ERASED
            else:
                found.setdefault(stored, row["reason"])
    return found


def erased_among(tx: Tx, workspace_id: str, emails: list[str]) -> list[str]:
    """Which of the addresses were erased (their hash is on the suppression list)."""
    found = suppressed_among(tx, workspace_id, emails)
    return [email for email in emails if found.get(email) == ERASED]
