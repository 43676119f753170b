"""Mail to postmaster@ and abuse@ of a served domain, kept for the workspace owning it.

Every read is scoped by workspace (and domain). What is kept of one message is bounded by
the caller (engine/forwarding/postmaster.py); `keep` also bounds how many messages a
workspace holds: past `limit`, the oldest are deleted in the transaction that adds one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_timestamp, timestamp
from storage.engines import in_one_snapshot
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class PostmasterMail:
    id: str
    workspace_id: str
    domain_id: str
    recipient: str
    envelope_from: str
    from_header: str
    subject: str
    message_id: str
    size_bytes: int  # of the message as it arrived
    truncated: bool  # whether `content` holds only its first octets
    received_at: datetime
    content: bytes = b""  # empty when read for a list


_FIELDS = (
    "id, workspace_id, domain_id, recipient, envelope_from, from_header, subject, message_id,"
    " size_bytes, truncated, received_at"
)


def _mail(row: Row) -> PostmasterMail:
    return PostmasterMail(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        recipient=row["recipient"],
        envelope_from=row["envelope_from"],
        from_header=row["from_header"],
        subject=row["subject"],
        message_id=row["message_id"],
        size_bytes=int(row["size_bytes"]),
        truncated=bool(row["truncated"]),
        received_at=parse_timestamp(row["received_at"]),
        content=bytes(row["content"]) if "content" in row else b"",
    )


def keep(tx: Tx, mail: PostmasterMail, limit: int) -> None:
    """Store one message; the workspace's oldest go once it holds more than `limit`."""
    tx.execute(
        f"INSERT INTO postmaster_mail ({_FIELDS}, content) VALUES (:id, :ws, :domain, :rcpt,"
        " :sender, :from_header, :subject, :message_id, :size, :truncated, :at, :content)",
        {
            "id": mail.id,
            "ws": mail.workspace_id,
            "domain": mail.domain_id,
            "rcpt": mail.recipient,
            "sender": mail.envelope_from,
            "from_header": mail.from_header,
            "subject": mail.subject,
            "message_id": mail.message_id,
            "size": mail.size_bytes,
            "truncated": mail.truncated,
            "at": timestamp(mail.received_at),
            "content": mail.content,
        },
    )
    tx.execute(
        "DELETE FROM postmaster_mail WHERE workspace_id = :ws AND id NOT IN (SELECT id FROM"
        " postmaster_mail WHERE workspace_id = :ws ORDER BY received_at DESC, id DESC"
        " LIMIT :limit)",
        {"ws": mail.workspace_id, "limit": limit},
    )


@in_one_snapshot
def page(
    tx: Tx, workspace_id: str, domain_id: str, offset: int, limit: int
) -> tuple[list[PostmasterMail], int]:
    """One page of a domain's kept mail, newest first, and how many there are in all."""
    params = {"ws": workspace_id, "domain": domain_id, "limit": limit, "offset": offset}
    where = "workspace_id = :ws AND domain_id = :domain"
    total = int(tx.value(f"SELECT COUNT(*) FROM postmaster_mail WHERE {where}", params))
    rows = tx.all(
        f"SELECT {_FIELDS} FROM postmaster_mail WHERE {where}"
        " ORDER BY received_at DESC, id DESC LIMIT :limit OFFSET :offset",
        params,
    )
    return [_mail(row) for row in rows], total


def get(tx: Tx, workspace_id: str, domain_id: str, mail_id: str) -> PostmasterMail | None:
    """One kept message with its content."""
    row = tx.octets(
        f"SELECT {_FIELDS}, content FROM postmaster_mail"
        " WHERE workspace_id = :ws AND domain_id = :domain AND id = :id",
        {"ws": workspace_id, "domain": domain_id, "id": mail_id},
    )
    return None if row is None else _mail(row)


def delete_of_domain(tx: Tx, domain_id: str) -> None:
    tx.execute("DELETE FROM postmaster_mail WHERE domain_id = :id", {"id": domain_id})


def purge_batch(tx: Tx, workspace_id: str, before: datetime, limit: int, now: datetime) -> int:
    """Delete at most `limit` of the workspace's messages received before `before` (its
    retention period, engine/retention.py); how many were deleted."""
    return tx.execute(
        "DELETE FROM postmaster_mail WHERE id IN (SELECT id FROM postmaster_mail"
        " WHERE workspace_id = :ws AND received_at < :before ORDER BY received_at LIMIT :limit)",
        {"ws": workspace_id, "before": timestamp(before), "limit": limit},
    )
