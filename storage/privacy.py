"""Erasure of one address from a workspace's stored data (`POST /v1/privacy/erase`).

The address leaves every place it is stored for the workspace: its contacts are deleted,
and stored emails (recipient lists, subject and bodies, header values, the raw message),
their recipients and events, webhook deliveries and activity-log entries have it rewritten
to a placeholder (`erased-<hash>@erased.invalid`). Only a keyed hash of it stays, on the
suppression list, so that it stays suppressed (storage/suppressions.py matches hashes too).
One unit of work, every statement scoped by workspace; running it twice touches nothing more.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import timestamp
from storage.tx import Tx

PLACEHOLDER_DOMAIN = "erased.invalid"
HASH_PREFIX = "sha256:"
_EMAIL_TEXT_COLUMNS = (
    "to_addresses",
    "cc_addresses",
    "bcc_addresses",
    "reply_to",
    "subject",
    "html",
    "text_body",
    "headers",
)


def address_hash(workspace_id: str, address: str) -> str:
    """What the suppression list keeps of an erased address: keyed by workspace, so one
    workspace's list says nothing about another's."""
    digest = hashlib.sha256(f"{workspace_id}:{address.lower()}".encode()).hexdigest()
    return HASH_PREFIX + digest


def placeholder(workspace_id: str, address: str) -> str:
    """The address that stands in for an erased one wherever it was written."""
    return f"erased-{address_hash(workspace_id, address)[len(HASH_PREFIX) :][:16]}@" + (
        PLACEHOLDER_DOMAIN
    )


@dataclass(frozen=True, slots=True)
class Erased:
    """What an erasure touched, by kind of record."""

    contacts: int
    emails: int
    events: int
    webhook_deliveries: int
    activity_entries: int
    suppression_hash: str


def _rewriter(address: str, replacement: str) -> Any:
    pattern = re.compile(re.escape(address), re.IGNORECASE)
    raw = re.compile(re.escape(address.encode()), re.IGNORECASE)

    def text(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(replacement, value)
        if isinstance(value, bytes | memoryview):
            return raw.sub(replacement.encode(), bytes(value))
        return value

    return text


def _erase_contacts(tx: Tx, workspace_id: str, address: str) -> int:
    rows = tx.all(
        "SELECT c.id, c.list_id FROM contacts c JOIN contact_lists l ON l.id = c.list_id"
        " WHERE l.workspace_id = :ws AND c.email = :e",
        {"ws": workspace_id, "e": address},
    )
    for row in rows:
        tx.execute("DELETE FROM contacts WHERE id = :id", {"id": row["id"]})
        tx.execute(
            "UPDATE contact_lists SET contact_count = contact_count - 1 WHERE id = :id",
            {"id": row["list_id"]},
        )
    return len(rows)


def _erase_emails(tx: Tx, workspace_id: str, address: str, ph: str, rewrite: Any) -> list[str]:
    ids = [
        str(row["email_id"])
        for row in tx.all(
            "SELECT DISTINCT r.email_id FROM email_recipients r JOIN emails e"
            " ON e.id = r.email_id WHERE e.workspace_id = :ws AND r.address = :e",
            {"ws": workspace_id, "e": address},
        )
    ]
    columns = ", ".join(_EMAIL_TEXT_COLUMNS)
    for email_id in ids:
        row = tx.one(
            f"SELECT {columns} FROM emails WHERE id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": workspace_id},
        )
        if row is None:
            continue
        sets = ", ".join(f"{c} = :{c}" for c in _EMAIL_TEXT_COLUMNS)
        tx.execute(
            f"UPDATE emails SET {sets} WHERE id = :id",
            {**{c: rewrite(row[c]) for c in _EMAIL_TEXT_COLUMNS}, "id": email_id},
        )
        tx.execute(
            "UPDATE email_recipients SET address = :ph WHERE email_id = :id AND address = :e",
            {"ph": ph, "id": email_id, "e": address},
        )
        # The sandbox's captured copies are test mail: erased whole rather than rewritten.
        tx.execute(
            "DELETE FROM sandbox_messages WHERE email_id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": workspace_id},
        )
        raw = tx.one("SELECT data FROM raw_messages WHERE email_id = :id", {"id": email_id})
        if raw is not None:
            tx.execute(
                "UPDATE raw_messages SET data = :data WHERE email_id = :id",
                {"data": rewrite(raw["data"]), "id": email_id},
            )
    return ids


def _rewrite_rows(
    tx: Tx, table: str, key: str, columns: tuple[str, ...], where: str, params: dict[str, Any]
) -> int:
    """Rewrite `columns` of the rows `where` takes (params carry the rewriter as `_rewrite`)."""
    rewrite = params.pop("_rewrite")
    rows = tx.all(f"SELECT {key}, {', '.join(columns)} FROM {table} WHERE {where}", params)
    sets = ", ".join(f"{c} = :{c}" for c in columns)
    for row in rows:
        tx.execute(
            f"UPDATE {table} SET {sets} WHERE {key} = :key",
            {**{c: rewrite(row[c]) for c in columns}, "key": row[key]},
        )
    return len(rows)


def _keep_suppressed(tx: Tx, workspace_id: str, address: str, now: datetime) -> str:
    hashed = address_hash(workspace_id, address)
    reason = tx.value(
        "SELECT reason FROM suppressions WHERE workspace_id = :ws AND email = :e",
        {"ws": workspace_id, "e": address},
    )
    tx.execute(
        "DELETE FROM suppressions WHERE workspace_id = :ws AND email = :e",
        {"ws": workspace_id, "e": address},
    )
    tx.execute(
        "DELETE FROM suppression_overrides WHERE workspace_id = :ws AND email = :e",
        {"ws": workspace_id, "e": address},
    )
    tx.execute(
        "INSERT INTO suppressions (workspace_id, email, reason, source_email_id, created_at)"
        " VALUES (:ws, :hash, :reason, NULL, :at) ON CONFLICT (workspace_id, email) DO NOTHING",
        {"ws": workspace_id, "hash": hashed, "reason": reason or "manual", "at": timestamp(now)},
    )
    return hashed


def erase(tx: Tx, workspace_id: str, address: str, now: datetime) -> Erased:
    """Erase `address` (lower case) from the workspace's data; what was touched."""
    ph = placeholder(workspace_id, address)
    rewrite = _rewriter(address, ph)
    contacts = _erase_contacts(tx, workspace_id, address)
    email_ids = _erase_emails(tx, workspace_id, address, ph, rewrite)
    # LIKE finds candidates (its `_` may match more); the rewrite replaces only the address.
    like = {"ws": workspace_id, "like": f"%{address}%"}
    events = _rewrite_rows(
        tx,
        "email_events",
        "id",
        ("recipient", "metadata"),
        "workspace_id = :ws AND (LOWER(recipient) = :e OR LOWER(metadata) LIKE :like)",
        {**like, "e": address, "_rewrite": rewrite},
    )
    deliveries = _rewrite_rows(
        tx,
        "webhook_deliveries",
        "id",
        ("payload",),
        "workspace_id = :ws AND LOWER(payload) LIKE :like",
        {**like, "_rewrite": rewrite},
    )
    entries = _rewrite_rows(
        tx,
        "activity_log",
        "id",
        ("target_name", "meta"),
        "workspace_id = :ws AND (LOWER(target_name) LIKE :like OR LOWER(meta) LIKE :like)",
        {**like, "_rewrite": rewrite},
    )
    hashed = _keep_suppressed(tx, workspace_id, address, now)
    return Erased(contacts, len(email_ids), events, deliveries, entries, hashed)
