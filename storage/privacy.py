"""Erasure of one address from a workspace's stored data (`POST /v1/privacy/erase`).

The address leaves every place it is stored for the workspace: its contacts are deleted,
and stored emails (every address field, subject and bodies, header values, attachments, the
raw message), their recipients and events, webhook deliveries, activity-log entries, forward
logs and jobs, the inbound messages kept for forwarding, the mail kept from postmaster@ and
abuse@, saved searches, stored idempotent answers, templates and the rest of `PASSES` have
it rewritten to a placeholder (`erased-<hash>@erased.invalid`); records of work still to do
for it (sandbox outcomes, agent previews) and its sandbox captures are deleted. Only a keyed hash of it stays, on the
suppression list, so that it stays suppressed (storage/suppressions.py matches hashes too).

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
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from storage import emails, inbound
from storage.codec import contains, from_json, in_list, timestamp, to_json
from storage.emails import Move, Summary
from storage.tx import Tx

PLACEHOLDER_DOMAIN = "erased.invalid"
# What the suppression list keeps of an erased address: an HMAC under a key derived from
# the master key (storage/sealing.py), so the list confirms a guessed address to no one
# without the key. Releases before it kept a plain SHA-256 (`LEGACY_PREFIX`): such entries
# cannot be converted without the address, so both are looked for, and erasing the address
# again replaces its legacy entry with a keyed one.
HASH_PREFIX = "hmac-sha256:"
LEGACY_PREFIX = "sha256:"
_EMAIL_TEXT_COLUMNS = (
    "from_address",  # a forwarded copy keeps its original author
    "from_name",
    "to_addresses",
    "cc_addresses",
    "bcc_addresses",
    "reply_to",
    "subject",
    "html",
    "text_body",
    "headers",
    "tags",
    "rejection_reason",
)


def address_hash(tx: Tx, workspace_id: str, address: str) -> str:
    """What the suppression list keeps of an erased address: keyed by the server's secret
    and by workspace, so one workspace's list says nothing about another's."""
    return HASH_PREFIX + tx.sealer.fingerprint(f"{workspace_id}:{address.lower()}")


def legacy_hash(workspace_id: str, address: str) -> str:
    """The unkeyed hash that releases before the keyed one kept (still matched)."""
    digest = hashlib.sha256(f"{workspace_id}:{address.lower()}".encode()).hexdigest()
    return LEGACY_PREFIX + digest


def placeholder(hashed: str) -> str:
    """The address that stands in for an erased one wherever it was written."""
    digest = hashed.partition(":")[2]
    return f"erased-{digest[:16]}@{PLACEHOLDER_DOMAIN}"


@dataclass(frozen=True, slots=True)
class Batch:
    """What one batch rewrote, and the key to go on after (None: the pass is done)."""

    touched: int
    after: str | None


Rewrite = Callable[[Any], Any]


@dataclass(frozen=True, slots=True)
class Erasure:
    """One erasure: the workspace, the address (lower case), what stands in for it."""

    workspace_id: str
    address: str
    replacement: str
    # The engine's rules: the move that cancels a recipient still to be tried (the address
    # is suppressed, its placeholder is no one's), and how its email is then summarised.
    cancel: Move
    summary: Summary
    now: datetime
    rewrite: Rewrite = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "rewrite", rewriter(self.replacement, self.address))

    @property
    def params(self) -> dict[str, str]:
        """`:ws`, `:e` the address, `:like` a LIKE pattern (`ESCAPE '!'`) finding it in text."""
        return {"ws": self.workspace_id, "e": self.address, "like": contains(self.address)}


# One batch of a pass: (tx, erasure, after, limit) -> Batch.
Pass = Callable[[Tx, Erasure, str, int], Batch]

# The address only where it stands whole: not the end of a longer one (`joann@x.org` when
# erasing `ann@x.org`; the characters that commonly make local parts) nor on a longer label
# (`ann@x.organic`). Followed by a dot it is erased: that may be `ann@x.org.uk`, but it is as
# often a sentence's end or a file name (`ann@x.org.pdf`), and erasing too much is the safe
# side.
_BEFORE = r"(?<![A-Za-z0-9._+-])"
_AFTER = r"(?![A-Za-z0-9-])"


def rewriter(replacement: str, address: str) -> Rewrite:
    """The function that replaces `address` (any case, standing whole) by `replacement` in
    text or bytes."""
    pattern = re.compile(_BEFORE + re.escape(address) + _AFTER, re.IGNORECASE)
    raw = re.compile((_BEFORE + re.escape(address) + _AFTER).encode(), re.IGNORECASE)

    def text(value: Any) -> Any:
        if isinstance(value, str):
            return pattern.sub(replacement, value)
        if isinstance(value, bytes | memoryview):
            return raw.sub(replacement.encode(), bytes(value))
        return value

    return text


def _batch(keys: list[str], limit: int, touched: int) -> Batch:
    return Batch(touched, keys[-1] if len(keys) == limit else None)


def _mentions(*columns: str) -> str:
    return " OR ".join(f"LOWER({c}) LIKE :like ESCAPE '!'" for c in columns)


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


def rewrite_base64(encoded: str, rewrite: Rewrite) -> str:
    """Base64 content with the address rewritten out of what it encodes (as it was, when it
    does not decode: intake never stores such a value)."""
    try:
        content = base64.b64decode(encoded, validate=True)
    except (TypeError, binascii.Error):
        return encoded
    rewritten = rewrite(content)
    return encoded if rewritten == content else base64.b64encode(rewritten).decode("ascii")


def _rewrite_attachments(stored: str, rewrite: Rewrite) -> str:
    attachments = from_json(stored)
    for attachment in attachments:
        attachment["filename"] = rewrite(attachment.get("filename"))
        if "content_base64" in attachment:
            attachment["content_base64"] = rewrite_base64(attachment["content_base64"], rewrite)
    return to_json(attachments)


def emails_batch(tx: Tx, erasure: Erasure, after: str, limit: int) -> Batch:
    """Rewrite the next emails that name the address anywhere in their fields (a recipient,
    the author of a forwarded copy, a reply-to, a mention in the subject or a body): fields,
    recipients and their servers' replies, attachments, the raw message; the sandbox's
    captured copies (test mail) are deleted whole. A recipient still to be tried (queued,
    deferred, scheduled, held) is cancelled first, and its email summarised again."""
    ids = [
        str(row["id"])
        for row in tx.all(
            "SELECT e.id FROM emails e WHERE e.workspace_id = :ws AND e.id > :after"
            " AND (LOWER(e.from_address) = :e OR EXISTS (SELECT 1 FROM email_recipients r"
            f" WHERE r.email_id = e.id AND r.address = :e) OR {_mentions(*_EMAIL_TEXT_COLUMNS)})"
            " ORDER BY e.id LIMIT :limit",
            {**erasure.params, "after": after, "limit": limit},
        )
    ]
    rewrite = erasure.rewrite
    columns = ", ".join(_EMAIL_TEXT_COLUMNS)
    sets = ", ".join(f"{c} = :{c}" for c in _EMAIL_TEXT_COLUMNS)
    touched = 0
    for email_id in ids:
        row = tx.one(
            f"SELECT {columns} FROM emails WHERE id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": erasure.workspace_id},
        )
        if row is None:
            continue
        rewritten = {c: rewrite(row[c]) for c in _EMAIL_TEXT_COLUMNS}
        waiting, waiting_params = in_list("s", erasure.cancel.from_)
        cancelled = tx.execute(
            "UPDATE email_recipients SET status = :to, next_attempt_at = NULL"
            f" WHERE email_id = :id AND address = :e AND status IN ({waiting})",
            {"to": erasure.cancel.to, "id": email_id, "e": erasure.address, **waiting_params},
        )
        if cancelled:
            emails.summarise(tx, [email_id], erasure.now, erasure.summary)
        was_recipient = tx.execute(
            "UPDATE email_recipients SET address = :ph WHERE email_id = :id AND address = :e",
            {"ph": erasure.replacement, "id": email_id, "e": erasure.address},
        )
        if not was_recipient and all(rewritten[c] == row[c] for c in _EMAIL_TEXT_COLUMNS):
            continue  # LIKE found a longer address that holds this one: not its email
        touched += 1
        tx.execute(f"UPDATE emails SET {sets} WHERE id = :id", {**rewritten, "id": email_id})
        for recipient in tx.all(
            "SELECT address, last_response, last_fault FROM email_recipients WHERE email_id = :id",
            {"id": email_id},
        ):
            tx.execute(
                "UPDATE email_recipients SET last_response = :response, last_fault = :fault"
                " WHERE email_id = :id AND address = :address",
                {
                    "response": rewrite(recipient["last_response"]),
                    "fault": rewrite(recipient["last_fault"]),
                    "id": email_id,
                    "address": recipient["address"],
                },
            )
        tx.execute(
            "DELETE FROM sandbox_messages WHERE email_id = :id AND workspace_id = :ws",
            {"id": email_id, "ws": erasure.workspace_id},
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
    return _batch(ids, limit, touched)


def _rows_pass(
    table: str,
    columns: tuple[str, ...],
    where: str = "",
    *,
    key: str = "id",
    scope: str = "workspace_id = :ws",
    delete: bool = False,
) -> Pass:
    """A pass over the workspace's rows of `table` (`scope`) that name the address: those
    `where` selects (given `:e` the address and `:like`), else those whose `columns` mention
    it. It rewrites the address out of `columns`, or with `delete` removes the rows whole
    (records of work not yet done for the address, or that exist only to be used once)."""
    where = where or _mentions(*columns)

    def batch(tx: Tx, erasure: Erasure, after: str, limit: int) -> Batch:
        rows = tx.all(
            f"SELECT {key} AS row_key, {', '.join(columns)} FROM {table} WHERE {scope}"
            f" AND ({where}) AND {key} > :after ORDER BY {key} LIMIT :limit",
            {**erasure.params, "after": after, "limit": limit},
        )
        touched = 0
        for row in rows:
            rewritten = {c: erasure.rewrite(row[c]) for c in columns}
            if all(rewritten[c] == row[c] for c in columns):
                continue  # LIKE found a longer address that holds this one: not its row
            touched += 1
            if delete:
                tx.execute(
                    f"DELETE FROM {table} WHERE {scope} AND {key} = :row_key",
                    {"ws": erasure.workspace_id, "row_key": row["row_key"]},
                )
                continue
            sets = ", ".join(f"{c} = :{c}" for c in columns)
            tx.execute(
                f"UPDATE {table} SET {sets} WHERE {scope} AND {key} = :row_key",
                {**rewritten, "ws": erasure.workspace_id, "row_key": row["row_key"]},
            )
        return _batch([str(row["row_key"]) for row in rows], limit, touched)

    return batch


def inbound_batch(tx: Tx, erasure: Erasure, after: str, limit: int) -> Batch:
    """Rewrite the address out of the next inbound messages kept for this workspace's
    forwards (stored as base64, so read one by one rather than found with LIKE)."""
    rows = tx.all(
        "SELECT m.id, m.envelope_from, m.recipients, m.data, m.content FROM inbound_messages m"
        " WHERE m.id > :after AND EXISTS (SELECT 1 FROM forward_jobs j"
        " WHERE j.message_id = m.id AND j.workspace_id = :ws) ORDER BY m.id LIMIT :limit",
        {"ws": erasure.workspace_id, "after": after, "limit": limit},
    )
    rewrite = erasure.rewrite
    touched = 0
    for row in rows:
        data = inbound.content_of(row)
        rewritten = rewrite(data)
        sender, recipients = rewrite(row["envelope_from"]), rewrite(row["recipients"])
        if (rewritten, sender, recipients) == (data, row["envelope_from"], row["recipients"]):
            continue
        touched += 1
        tx.execute(
            "UPDATE inbound_messages SET envelope_from = :sender, recipients = :rcpts,"
            " data = '', content = :content, size_bytes = :size WHERE id = :id",
            {
                "sender": sender,
                "rcpts": recipients,
                "content": rewritten,
                "size": len(rewritten),
                "id": row["id"],
            },
        )
    return _batch([str(row["id"]) for row in rows], limit, touched)


def _octets_pass(table: str, columns: tuple[str, ...]) -> Pass:
    """A pass rewriting the address out of `columns` of a workspace's rows in `table`, some
    of them bytes, so read one by one rather than found with LIKE."""
    listed = ", ".join(columns)
    sets = ", ".join(f"{c} = :{c}" for c in columns)

    def batch(tx: Tx, erasure: Erasure, after: str, limit: int) -> Batch:
        rows = tx.all(
            f"SELECT id, {listed} FROM {table} WHERE workspace_id = :ws AND id > :after"
            " ORDER BY id LIMIT :limit",
            {"ws": erasure.workspace_id, "after": after, "limit": limit},
        )
        touched = 0
        for row in rows:
            # PostgreSQL may hand bytea over as a memoryview: compared and rewritten as bytes.
            stored = {
                c: bytes(row[c]) if isinstance(row[c], memoryview) else row[c] for c in columns
            }
            rewritten = {c: erasure.rewrite(v) for c, v in stored.items()}
            if rewritten == stored:
                continue
            touched += 1
            tx.execute(
                f"UPDATE {table} SET {sets} WHERE workspace_id = :ws AND id = :row_id",
                {**rewritten, "ws": erasure.workspace_id, "row_id": row["id"]},
            )
        return _batch([str(row["id"]) for row in rows], limit, touched)

    return batch


_CONTACTS_OF_WORKSPACE = "list_id IN (SELECT id FROM contact_lists WHERE workspace_id = :ws)"

# Every pass, by the name its count is answered under, in the order they run. Together with
# the contacts and the suppression list they reach every table a tenant's data about a
# person can be written to; the workspace's own configuration (its domains, senders,
# forwards' addresses, webhook URLs) and its users' accounts are not a recipient's data.
PASSES: tuple[tuple[str, Pass], ...] = (
    ("emails", emails_batch),
    (
        "events",
        _rows_pass(
            "email_events",
            ("recipient", "metadata"),
            f"LOWER(recipient) = :e OR {_mentions('metadata')}",
        ),
    ),
    (
        "webhook_deliveries",
        _rows_pass("webhook_deliveries", ("payload", "response_body", "last_fault")),
    ),
    ("activity_entries", _rows_pass("activity_log", ("target_name", "meta"))),
    (
        "forward_logs",
        _rows_pass("forward_logs", ("from_address", "original_to", "forwarded_to", "subject")),
    ),
    ("forward_jobs", _rows_pass("forward_jobs", ("original_to", "target", "last_error"))),
    ("inbound_messages", inbound_batch),
    # Outcomes a test recipient scripted (sandbox) are work for that recipient: dropped.
    (
        "sandbox_outcomes",
        _rows_pass(
            "sandbox_outcomes",
            ("recipient", "error", "last_fault"),
            f"LOWER(recipient) = :e OR {_mentions('error', 'last_fault')}",
            delete=True,
        ),
    ),
    ("saved_searches", _rows_pass("saved_searches", ("searches",), key="user_id")),
    # An agent's preview not yet confirmed would send to the address: it can no longer be.
    (
        "agent_previews",
        _rows_pass("agent_confirmations", ("payload",), key="token_hash", delete=True),
    ),
    ("idempotent_responses", _rows_pass("idempotency_keys", ("response",), key="key")),
    ("delivery_incidents", _rows_pass("delivery_incidents", ("sample_reply",))),
    (
        "templates",
        _rows_pass(
            "templates", ("name", "subject", "html_body", "text_body", "blocks_json", "variables")
        ),
    ),
    ("broadcasts", _rows_pass("broadcasts", ("subject", "failure_reason"))),
    ("contact_lists", _rows_pass("contact_lists", ("name", "description"))),
    (
        "other_contacts",
        _rows_pass("contacts", ("name", "metadata"), scope=_CONTACTS_OF_WORKSPACE),
    ),
    # POSTs the sandbox captured, and the mail kept from postmaster@ and abuse@.
    ("sandbox_requests", _octets_pass("sandbox_posts", ("url", "headers", "body"))),
    (
        "postmaster_mail",
        _octets_pass("postmaster_mail", ("envelope_from", "from_header", "subject", "content")),
    ),
)


def keep_suppressed(tx: Tx, workspace_id: str, address: str, now: datetime) -> str:
    """Put the address's keyed hash on the suppression list in its place (its reason kept,
    else `manual`), and forget its override window; the hash. A legacy hash of it is
    replaced by the keyed one."""
    hashed = address_hash(tx, workspace_id, address)
    legacy = legacy_hash(workspace_id, address)
    kept = tx.all(
        "SELECT email, reason FROM suppressions WHERE workspace_id = :ws"
        " AND email IN (:e, :legacy)",
        {"ws": workspace_id, "e": address, "legacy": legacy},
    )
    reasons = {row["email"]: row["reason"] for row in kept}
    reason = reasons.get(address) or reasons.get(legacy) or "manual"
    tx.execute(
        "DELETE FROM suppressions WHERE workspace_id = :ws AND email IN (:e, :legacy)",
        {"ws": workspace_id, "e": address, "legacy": legacy},
    )
    tx.execute(
        "DELETE FROM suppression_overrides WHERE workspace_id = :ws AND email = :e",
        {"ws": workspace_id, "e": address},
    )
    tx.execute(
        "INSERT INTO suppressions (workspace_id, email, reason, source_email_id, created_at)"
        " VALUES (:ws, :hash, :reason, NULL, :at) ON CONFLICT (workspace_id, email) DO NOTHING",
        {"ws": workspace_id, "hash": hashed, "reason": reason, "at": timestamp(now)},
    )
    return hashed


def database_time(tx: Tx) -> Any:
    """The database's clock as this statement runs (PostgreSQL); None on SQLite, whose
    writers take turns (`begun_before` has nothing to wait for there)."""
    if tx.dialect != "postgresql":
        return None
    return tx.value("SELECT clock_timestamp()")


def begun_before(tx: Tx, moment: Any) -> int:
    """How many other clients' transactions on this database, begun before `moment`
    (`database_time`), are still open (the server's own, such as autovacuum's, are not
    sends, and may run for minutes)."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            " AND xact_start < :moment",
            {"moment": moment},
        )
    )
