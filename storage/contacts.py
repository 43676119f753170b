"""Contact lists and their contacts.

A list keeps its `contact_count` and the next `seq` to hand out; both change in the same
statement batch as the contacts they count. Writers that add or remove contacts take the
list with `lock_list` first (a row lock on PostgreSQL; SQLite's write transaction is already
exclusive), so two imports into one list cannot both pass the plan's limit or the duplicate
check.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_timestamp, timestamp, to_json
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class ContactList:
    id: str
    workspace_id: str
    name: str
    description: str | None
    icon_seed: str | None
    contact_count: int
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Contact:
    id: str
    list_id: str
    email: str
    name: str | None
    metadata: dict[str, Any] | None
    created_at: datetime


@dataclass(frozen=True, slots=True)
class Recipient:
    """A contact as a bulk send sees it: its place in the list and any suppression."""

    seq: int
    email: str
    name: str | None
    metadata: dict[str, Any] | None
    suppressed: str | None  # the suppression reason, if the address is suppressed


def _list(row: Row) -> ContactList:
    return ContactList(
        id=row["id"],
        workspace_id=row["workspace_id"],
        name=row["name"],
        description=row["description"],
        icon_seed=row["icon_seed"],
        contact_count=int(row["contact_count"]),
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


def _contact(row: Row) -> Contact:
    return Contact(
        id=row["id"],
        list_id=row["list_id"],
        email=row["email"],
        name=row["name"],
        metadata=from_json(row["metadata"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert_list(tx: Tx, contact_list: ContactList) -> None:
    tx.execute(
        "INSERT INTO contact_lists (id, workspace_id, name, description, icon_seed,"
        " contact_count, next_seq, created_at, updated_at) VALUES (:id, :ws, :name,"
        " :description, :icon_seed, 0, 0, :created_at, :updated_at)",
        {
            "id": contact_list.id,
            "ws": contact_list.workspace_id,
            "name": contact_list.name,
            "description": contact_list.description,
            "icon_seed": contact_list.icon_seed,
            "created_at": timestamp(contact_list.created_at),
            "updated_at": timestamp(contact_list.updated_at),
        },
    )


def count_lists(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value(
            "SELECT COUNT(*) FROM contact_lists WHERE workspace_id = :ws", {"ws": workspace_id}
        )
    )


def get_list(tx: Tx, workspace_id: str, list_id: str) -> ContactList | None:
    row = tx.one(
        "SELECT * FROM contact_lists WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": list_id},
    )
    return None if row is None else _list(row)


def lock_list(tx: Tx, workspace_id: str, list_id: str) -> ContactList | None:
    """The list, locked against other writers until the transaction ends."""
    lock = tx.row_lock()
    row = tx.one(
        f"SELECT * FROM contact_lists WHERE workspace_id = :ws AND id = :id{lock}",
        {"ws": workspace_id, "id": list_id},
    )
    return None if row is None else _list(row)


def list_all(tx: Tx, workspace_id: str) -> list[ContactList]:
    rows = tx.all(
        "SELECT * FROM contact_lists WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_list(row) for row in rows]


def update_list(tx: Tx, contact_list: ContactList) -> None:
    tx.execute(
        "UPDATE contact_lists SET name = :name, description = :description,"
        " icon_seed = :icon_seed, updated_at = :updated_at WHERE id = :id",
        {
            "id": contact_list.id,
            "name": contact_list.name,
            "description": contact_list.description,
            "icon_seed": contact_list.icon_seed,
            "updated_at": timestamp(contact_list.updated_at),
        },
    )


def delete_list(tx: Tx, list_id: str) -> None:
    """Remove a list and every contact in it."""
    tx.execute("DELETE FROM contacts WHERE list_id = :id", {"id": list_id})
    tx.execute("DELETE FROM contact_lists WHERE id = :id", {"id": list_id})


def page(tx: Tx, list_id: str, offset: int, limit: int) -> list[Contact]:
    """Contacts in the order they were added."""
    rows = tx.all(
        "SELECT * FROM contacts WHERE list_id = :id ORDER BY seq LIMIT :limit OFFSET :offset",
        {"id": list_id, "limit": limit, "offset": offset},
    )
    return [_contact(row) for row in rows]


def existing_emails(tx: Tx, list_id: str, emails: Sequence[str]) -> set[str]:
    """Which of the addresses are already in the list (one query per call)."""
    if not emails:
        return set()
    names = {f"e{i}": email for i, email in enumerate(emails)}
    placeholders = ", ".join(f":{name}" for name in names)
    rows = tx.all(
        f"SELECT email FROM contacts WHERE list_id = :list AND email IN ({placeholders})",
        {"list": list_id, **names},
    )
    return {row["email"] for row in rows}


def add(tx: Tx, list_id: str, contacts: Sequence[Contact]) -> None:
    """Append contacts to a list (taken with `lock_list`), in one multi-row statement."""
    if not contacts:
        return
    first = int(tx.value("SELECT next_seq FROM contact_lists WHERE id = :id", {"id": list_id}))
    tx.execute_many(
        "INSERT INTO contacts (id, list_id, email, name, metadata, seq, created_at)"
        " VALUES (:id, :list_id, :email, :name, :metadata, :seq, :created_at)",
        (
            {
                "id": c.id,
                "list_id": list_id,
                "email": c.email,
                "name": c.name,
                "metadata": None if c.metadata is None else to_json(c.metadata),
                "seq": first + i,
                "created_at": timestamp(c.created_at),
            }
            for i, c in enumerate(contacts)
        ),
    )
    tx.execute(
        "UPDATE contact_lists SET contact_count = contact_count + :n, next_seq = next_seq + :n"
        " WHERE id = :id",
        {"n": len(contacts), "id": list_id},
    )


def get_contact(tx: Tx, list_id: str, contact_id: str) -> Contact | None:
    row = tx.one(
        "SELECT * FROM contacts WHERE list_id = :list AND id = :id",
        {"list": list_id, "id": contact_id},
    )
    return None if row is None else _contact(row)


def delete_contact(tx: Tx, list_id: str, contact_id: str) -> None:
    tx.execute("DELETE FROM contacts WHERE id = :id", {"id": contact_id})
    tx.execute(
        "UPDATE contact_lists SET contact_count = contact_count - 1 WHERE id = :id",
        {"id": list_id},
    )


def count_suppressed(tx: Tx, workspace_id: str, list_id: str) -> int:
    """How many of the list's addresses are on the workspace's suppression list."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM contacts c JOIN suppressions s"
            " ON s.workspace_id = :ws AND s.email = c.email WHERE c.list_id = :list",
            {"ws": workspace_id, "list": list_id},
        )
    )


def recipients_after(
    tx: Tx, workspace_id: str, list_id: str, after_seq: int, limit: int
) -> list[Recipient]:
    """The next `limit` contacts after `after_seq`, each with its suppression reason if any."""
    rows = tx.all(
        "SELECT c.seq, c.email, c.name, c.metadata, s.reason FROM contacts c"
        " LEFT JOIN suppressions s ON s.workspace_id = :ws AND s.email = c.email"
        " WHERE c.list_id = :list AND c.seq > :after ORDER BY c.seq LIMIT :limit",
        {"ws": workspace_id, "list": list_id, "after": after_seq, "limit": limit},
    )
    return [
        Recipient(
            seq=int(row["seq"]),
            email=row["email"],
            name=row["name"],
            metadata=from_json(row["metadata"]),
            suppressed=row["reason"],
        )
        for row in rows
    ]
