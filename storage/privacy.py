"""Erasure of one address from a workspace's stored data (`POST /v1/privacy/erase`).

The address leaves every place it is stored for the workspace: its contacts are deleted,
and stored emails (recipient lists, subject and bodies, header values, attachments, the raw
message), their recipients and events, webhook deliveries, activity-log entries, forward
logs and the inbound messages kept for forwarding have it rewritten to a placeholder
(`erased-<hash>@erased.invalid`). Only a keyed hash of it stays, on the suppression list, so
that it stays suppressed (storage/suppressions.py matches hashes too).

The rewriting goes in bounded batches, one unit of work each (`PASSES`), each taking the rows
after the last key the previous batch saw, so a batch never holds the writer long and a
candidate the rewrite leaves alone is not taken again. Every statement is scoped by
workspace; running an erasure twice touches nothing more.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from storage.codec import from_json, timestamp, to_json
from storage.tx import Tx

PLACEHOLDER_DOMAIN = "erased.invalid"
HASH_PREFIX = "sha256:"
_EMAIL_TEXT_COLUMNS = (
    "from_address",  # a forwarded copy keeps its original author
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
class Batch:
    """What one batch rewrote, and the key to go on after (None: the pass is done)."""

    touched: int
    after: str | None


Rewrite = Callable[[Any], Any]
# One batch of a pass: (tx, workspace, address, rewrite, after, limit) -> Batch.
Pass = Callable[[Tx, str, str, Rewrite, str, int], Batch]


def rewriter(workspace_id: str, address: str) -> Rewrite:
    """The function that replaces `address` (any case) by its placeholder in text or bytes."""
    replacement = placeholder(workspace_id, address)
    pattern = re.compile(re.escape(address), re.IGNORECASE)
    raw = re.compile(re.escape(address.encode()), re.IGNORECASE)

    def text(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(replacement, value)
        if isinstance(value, bytes | memoryview):
            return raw.sub(replacement.encode(), bytes(value))
        return value

    return text


def _batch(keys: list[str], limit: int, touched: int) -> Batch:
    return Batch(touched, keys[-1] if len(keys) == limit else None)


def erase_contacts(tx: Tx, workspace_id: str, address: str) -> int:
    """Delete the address's contacts (one per list at most, so one unit); how many."""
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


def _rewrite_attachments(stored: str, rewrite: Rewrite) -> str:
    attachments = from_json(stored)
    for attachment in attachments:
        attachment["filename"] = rewrite(attachment.get("filename"))
        try:
            content = base64.b64decode(attachment["content_base64"], validate=True)
        except (KeyError, TypeError, binascii.Error):
            continue  # nothing readable to rewrite (intake never stores such a value)
        attachment["content_base64"] = base64.b64encode(rewrite(content)).decode("ascii")
    return to_json(attachments)


def emails_batch(
    tx: Tx, workspace_id: str, address: str, rewrite: Rewrite, after: str, limit: int
) -> Batch:
    """Rewrite the next emails sent to the address or from it (a forwarded copy of its
    mail): fields, recipients, attachments, the raw message; the sandbox's captured copies
    (test mail) are deleted whole."""
    ids = [
        str(row["id"])
        for row in tx.all(
            "SELECT e.id FROM emails e WHERE e.workspace_id = :ws AND e.id > :after"
            " AND (LOWER(e.from_address) = :e OR EXISTS (SELECT 1 FROM email_recipients r"
            " WHERE r.email_id = e.id AND r.address = :e)) ORDER BY e.id LIMIT :limit",
            {"ws": workspace_id, "e": address, "after": after, "limit": limit},
        )
    ]
    ph = placeholder(workspace_id, address)
    columns = ", ".join(_EMAIL_TEXT_COLUMNS)
    sets = ", ".join(f"{c} = :{c}" for c in _EMAIL_TEXT_COLUMNS)
    for email_id in ids:
        row = tx.one(
            f"SELECT {columns} FROM emails WHERE id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": workspace_id},
        )
        if row is None:
            continue
        tx.execute(
            f"UPDATE emails SET {sets} WHERE id = :id",
            {**{c: rewrite(row[c]) for c in _EMAIL_TEXT_COLUMNS}, "id": email_id},
        )
        tx.execute(
            "UPDATE email_recipients SET address = :ph WHERE email_id = :id AND address = :e",
            {"ph": ph, "id": email_id, "e": address},
        )
        tx.execute(
            "DELETE FROM sandbox_messages WHERE email_id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": workspace_id},
        )
        attached = tx.one(
            "SELECT attachments FROM email_attachments WHERE email_id = :id", {"id": email_id}
        )
        if attached is not None:
            tx.execute(
                "UPDATE email_attachments SET attachments = :a WHERE email_id = :id",
                {"a": _rewrite_attachments(attached["attachments"], rewrite), "id": email_id},
            )
        raw = tx.one("SELECT data FROM raw_messages WHERE email_id = :id", {"id": email_id})
        if raw is not None:
            tx.execute(
                "UPDATE raw_messages SET data = :data WHERE email_id = :id",
                {"data": rewrite(raw["data"]), "id": email_id},
            )
    return _batch(ids, limit, len(ids))


def _rows_pass(table: str, columns: tuple[str, ...], where: str) -> Pass:
    """A pass rewriting `columns` of the workspace's rows of `table` that `where` selects
    (given `:ws`, `:e` the address and `:like` a LIKE pattern of it)."""

    def batch(
        tx: Tx, workspace_id: str, address: str, rewrite: Rewrite, after: str, limit: int
    ) -> Batch:
        # LIKE finds candidates (its `_` may match more); the rewrite replaces only the address.
        rows = tx.all(
            f"SELECT id, {', '.join(columns)} FROM {table} WHERE workspace_id = :ws"
            f" AND ({where}) AND id > :after ORDER BY id LIMIT :limit",
            {
                "ws": workspace_id,
                "e": address,
                "like": f"%{address}%",
                "after": after,
                "limit": limit,
            },
        )
        sets = ", ".join(f"{c} = :{c}" for c in columns)
        for row in rows:
            tx.execute(
                f"UPDATE {table} SET {sets} WHERE id = :key",
                {**{c: rewrite(row[c]) for c in columns}, "key": row["id"]},
            )
        return _batch([str(row["id"]) for row in rows], limit, len(rows))

    return batch


def inbound_batch(
    tx: Tx, workspace_id: str, address: str, rewrite: Rewrite, after: str, limit: int
) -> Batch:
    """Rewrite the address out of the next inbound messages kept for this workspace's
    forwards (stored as base64, so read one by one rather than found with LIKE)."""
    rows = tx.all(
        "SELECT m.id, m.envelope_from, m.recipients, m.data FROM inbound_messages m"
        " WHERE m.id > :after AND EXISTS (SELECT 1 FROM forward_jobs j"
        " WHERE j.message_id = m.id AND j.workspace_id = :ws) ORDER BY m.id LIMIT :limit",
        {"ws": workspace_id, "after": after, "limit": limit},
    )
    touched = 0
    for row in rows:
        data = base64.b64decode(row["data"])
        rewritten = rewrite(data)
        sender, recipients = rewrite(row["envelope_from"]), rewrite(row["recipients"])
        if (rewritten, sender, recipients) == (data, row["envelope_from"], row["recipients"]):
            continue
        touched += 1
        tx.execute(
            "UPDATE inbound_messages SET envelope_from = :sender, recipients = :rcpts,"
            " data = :data, size_bytes = :size WHERE id = :id",
            {
                "sender": sender,
                "rcpts": recipients,
                "data": base64.b64encode(rewritten).decode("ascii"),
                "size": len(rewritten),
                "id": row["id"],
            },
        )
    return _batch([str(row["id"]) for row in rows], limit, touched)


def sandbox_requests_batch(
    tx: Tx, workspace_id: str, address: str, rewrite: Rewrite, after: str, limit: int
) -> Batch:
    """Rewrite the address out of the next POSTs the sandbox captured for this workspace
    (bodies are bytes, so read one by one rather than found with LIKE)."""
    rows = tx.all(
        "SELECT id, url, headers, body FROM sandbox_posts WHERE workspace_id = :ws"
        " AND id > :after ORDER BY id LIMIT :limit",
        {"ws": workspace_id, "after": after, "limit": limit},
    )
    touched = 0
    for row in rows:
        body = bytes(row["body"])
        changed = (rewrite(row["url"]), rewrite(row["headers"]), rewrite(body))
        if changed == (row["url"], row["headers"], body):
            continue
        touched += 1
        tx.execute(
            "UPDATE sandbox_posts SET url = :url, headers = :headers, body = :body WHERE id = :id",
            {"url": changed[0], "headers": changed[1], "body": changed[2], "id": row["id"]},
        )
    return _batch([str(row["id"]) for row in rows], limit, touched)


# Every pass, by the name its count is answered under, in the order they run.
PASSES: tuple[tuple[str, Pass], ...] = (
    ("emails", emails_batch),
    (
        "events",
        _rows_pass(
            "email_events",
            ("recipient", "metadata"),
            "LOWER(recipient) = :e OR LOWER(metadata) LIKE :like",
        ),
    ),
    (
        "webhook_deliveries",
        _rows_pass("webhook_deliveries", ("payload",), "LOWER(payload) LIKE :like"),
    ),
    (
        "activity_entries",
        _rows_pass(
            "activity_log",
            ("target_name", "meta"),
            "LOWER(target_name) LIKE :like OR LOWER(meta) LIKE :like",
        ),
    ),
    (
        "forward_logs",
        _rows_pass(
            "forward_logs",
            ("from_address", "original_to", "forwarded_to", "subject"),
            "LOWER(from_address) = :e OR LOWER(original_to) = :e OR LOWER(forwarded_to) = :e"
            " OR LOWER(subject) LIKE :like",
        ),
    ),
    ("inbound_messages", inbound_batch),
    ("sandbox_requests", sandbox_requests_batch),
)


def keep_suppressed(tx: Tx, workspace_id: str, address: str, now: datetime) -> str:
    """Put the address's hash on the suppression list in its place (its reason kept, else
    `manual`); the hash."""
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
