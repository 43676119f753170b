"""The sandbox: which workspaces are in it, the mail and HTTP POSTs captured for them, and
scripted outcomes.

A captured message keeps the signed bytes as delivery built them, apart from its summary
columns so lists never read them. Scripted outcomes that fall due later (a complaint, an
open, a click) are work rows leased like webhook deliveries: `pending` until done, `done`
after, `failed` when quarantined.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import from_json, in_list, parse_timestamp, timestamp, to_json
from storage.engines import in_one_snapshot
from storage.leases import Claimed, FaultPolicy, LeasedTable
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class SigningKey:
    """What a captured message's DKIM signature is checked against: the domain's own key."""

    domain: str
    selector: str
    public_key: str


@dataclass(frozen=True, slots=True)
class Captured:
    """A message the sandbox accepted instead of a recipient's server."""

    id: str
    workspace_id: str
    email_id: str
    envelope_from: str
    recipients: list[str]
    subject: str
    dkim: str  # "pass", or "fail: <why>"
    created_at: datetime
    data: bytes | None = None  # loaded for one message, never for lists


@dataclass(frozen=True, slots=True)
class CapturedPost:
    """An HTTP POST the sandbox took instead of its receiver (a webhook delivery, a forward
    to a URL), as the receiver would have got it."""

    id: str
    workspace_id: str
    kind: str  # webhook, forward
    source_id: str  # the webhook delivery, or the forward job
    url: str
    headers: list[tuple[str, str]]
    created_at: datetime
    body: bytes | None = None  # loaded for one post, never for lists


@dataclass(frozen=True, slots=True)
class Scheduled:
    """An outcome a recipient scripts for later."""

    id: str
    workspace_id: str
    email_id: str
    recipient: str
    kind: str  # complaint, open, click
    due_at: datetime


def is_sandboxed(tx: Tx, workspace_id: str, *, lock: bool = False) -> bool:
    """Whether the workspace is in the sandbox; `lock`: and hold its row until the unit ends
    (on PostgreSQL), so a mark and a departure from the sandbox never interleave."""
    suffix = tx.row_lock(when=lock)
    value = tx.value("SELECT sandbox FROM workspaces WHERE id = :id" + suffix, {"id": workspace_id})
    return bool(value)


def set_sandboxed(tx: Tx, workspace_id: str, on: bool) -> bool:
    """Put a workspace in or out of the sandbox; False when it already was."""
    changed = tx.execute(
        "UPDATE workspaces SET sandbox = :on WHERE id = :id AND sandbox <> :on",
        {"on": on, "id": workspace_id},
    )
    return changed == 1


def sandboxed_senders(
    tx: Tx, workspace_ids: Collection[str], domain_ids: Collection[str]
) -> tuple[set[str], dict[str, SigningKey]]:
    """Which of these workspaces are in the sandbox, and the signing keys of those of the
    domains that belong to one of them."""
    if not workspace_ids:
        return set(), {}
    ids, params = in_list("w", workspace_ids)
    sandboxed = {
        str(row["id"])
        for row in tx.all(f"SELECT id FROM workspaces WHERE sandbox AND id IN ({ids})", params)
    }
    if not sandboxed or not domain_ids:
        return sandboxed, {}
    ids, params = in_list("d", domain_ids)
    rows = tx.all(
        "SELECT d.id, d.name, d.dkim_selector, d.dkim_public_key FROM domains d"
        f" JOIN workspaces w ON w.id = d.workspace_id WHERE w.sandbox AND d.id IN ({ids})",
        params,
    )
    keys = {
        str(row["id"]): SigningKey(row["name"], row["dkim_selector"], row["dkim_public_key"])
        for row in rows
    }
    return sandboxed, keys


def sandboxed_emails(tx: Tx, email_ids: Collection[str]) -> set[str]:
    """Those of these emails whose workspace is in sandbox mode."""
    if not email_ids:
        return set()
    ids, params = in_list("e", email_ids)
    rows = tx.all(
        "SELECT e.id FROM emails e JOIN workspaces w ON w.id = e.workspace_id"
        f" WHERE w.sandbox AND e.id IN ({ids})",
        params,
    )
    return {str(row["id"]) for row in rows}


def sandbox_verified_domains(tx: Tx, workspace_id: str) -> list[tuple[str, str]]:
    """(id, name) of the workspace's domains the sandbox marked verified, oldest first."""
    rows = tx.all(
        "SELECT id, name FROM domains WHERE workspace_id = :ws AND sandbox_verified"
        " ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [(str(row["id"]), str(row["name"])) for row in rows]


def drop_mark(tx: Tx, domain_id: str, now: datetime) -> bool:
    """Set a domain the sandbox marked verified back to pending, its DNS record to be looked
    for again from now (engine/domains/checker.py); False when it bore no mark."""
    changed = tx.execute(
        "UPDATE domains SET status = 'pending', record_status = '{}', verified_at = NULL,"
        " record_findings = '{}',"
        " sandbox_verified = FALSE, pending_since = :now WHERE id = :id AND sandbox_verified",
        {"now": timestamp(now), "id": domain_id},
    )
    return changed == 1


def mail_waiting(tx: Tx, workspace_id: str) -> int:
    """The workspace's emails that could still go out: scheduled, queued, deferred or held
    (a release would send it)."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM emails WHERE workspace_id = :ws"
            " AND status IN ('scheduled', 'queued', 'deferred', 'held')",
            {"ws": workspace_id},
        )
    )


def capture(
    tx: Tx, messages: Sequence[Captured], scheduled: Sequence[Scheduled], now: datetime
) -> None:
    """Store captured messages and the outcomes scripted for later, in one unit."""
    tx.execute_many(
        "INSERT INTO sandbox_messages (id, workspace_id, email_id, envelope_from, recipients,"
        " subject, dkim, data, created_at) VALUES (:id, :ws, :email_id, :envelope_from,"
        " :recipients, :subject, :dkim, :data, :created_at)",
        (
            {
                "id": m.id,
                "ws": m.workspace_id,
                "email_id": m.email_id,
                "envelope_from": m.envelope_from,
                "recipients": to_json(m.recipients),
                "subject": m.subject,
                "dkim": m.dkim,
                "data": m.data or b"",
                "created_at": timestamp(m.created_at),
            }
            for m in messages
        ),
    )
    tx.execute_many(
        "INSERT INTO sandbox_outcomes (id, workspace_id, email_id, recipient, kind, status,"
        " due_at, created_at, updated_at) VALUES (:id, :ws, :email_id, :recipient, :kind,"
        " 'pending', :due_at, :now, :now)",
        (
            {
                "id": s.id,
                "ws": s.workspace_id,
                "email_id": s.email_id,
                "recipient": s.recipient,
                "kind": s.kind,
                "due_at": timestamp(s.due_at),
                "now": timestamp(now),
            }
            for s in scheduled
        ),
    )


_SUMMARY = "id, workspace_id, email_id, envelope_from, recipients, subject, dkim, created_at"


def _captured(row: Row) -> Captured:
    data = row.get("data")
    return Captured(
        id=row["id"],
        workspace_id=row["workspace_id"],
        email_id=row["email_id"],
        envelope_from=row["envelope_from"],
        recipients=from_json(row["recipients"]),
        subject=row["subject"],
        dkim=row["dkim"],
        created_at=parse_timestamp(row["created_at"]),
        data=None if data is None else bytes(data),
    )


@in_one_snapshot
def messages_page(
    tx: Tx, workspace_id: str, email_id: str | None, offset: int, limit: int
) -> tuple[list[Captured], int]:
    """Captured messages newest first (of one email, when given), and how many there are."""
    where = "workspace_id = :ws"
    params: dict[str, object] = {"ws": workspace_id, "limit": limit, "offset": offset}
    if email_id is not None:
        where += " AND email_id = :email_id"
        params["email_id"] = email_id
    rows = tx.all(
        f"SELECT {_SUMMARY} FROM sandbox_messages WHERE {where}"
        " ORDER BY created_at DESC, id DESC LIMIT :limit OFFSET :offset",
        params,
    )
    total = int(tx.value(f"SELECT COUNT(*) FROM sandbox_messages WHERE {where}", params))
    return [_captured(row) for row in rows], total


def message(tx: Tx, workspace_id: str, message_id: str) -> Captured | None:
    """One captured message with its bytes."""
    row = tx.one(
        "SELECT * FROM sandbox_messages WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": message_id},
    )
    return None if row is None else _captured(row)


# A quarantined outcome is failed, with the error beside it.
OUTCOMES = LeasedTable("sandbox_outcomes", "due_at", "failed", "error")


def _scheduled(row: Row) -> Scheduled:
    return Scheduled(
        id=row["id"],
        workspace_id=row["workspace_id"],
        email_id=row["email_id"],
        recipient=row["recipient"],
        kind=row["kind"],
        due_at=parse_timestamp(row["due_at"]),
    )


def claim_due(
    tx: Tx, now: datetime, lease_until: datetime, node: str, limit: int, faults: FaultPolicy
) -> Claimed[Scheduled]:
    return OUTCOMES.claim_due(tx, now, lease_until, node, limit, _scheduled, faults)


def finish(tx: Tx, outcome_id: str, now: datetime) -> None:
    tx.execute(
        "UPDATE sandbox_outcomes SET status = 'done', due_at = NULL, lease_until = NULL,"
        " leased_by = NULL, updated_at = :now WHERE id = :id",
        {"now": timestamp(now), "id": outcome_id},
    )


def pending_outcomes(tx: Tx, workspace_id: str, email_id: str | None) -> list[Scheduled]:
    """The workspace's scripted outcomes still to happen (of one email, given one), soonest
    first."""
    where = "workspace_id = :ws AND status = 'pending'"
    params = {"ws": workspace_id}
    if email_id is not None:
        where += " AND email_id = :email_id"
        params["email_id"] = email_id
    rows = tx.all(f"SELECT * FROM sandbox_outcomes WHERE {where} ORDER BY due_at, id", params)
    return [_scheduled(row) for row in rows]


def bring_forward(tx: Tx, workspace_id: str, email_id: str | None, now: datetime) -> int:
    """Make the workspace's pending outcomes (of one email, given one) due now; those a node
    holds are under way already and left alone. How many were brought forward."""
    where = "workspace_id = :ws AND status = 'pending' AND leased_by IS NULL AND due_at > :now"
    params = {"ws": workspace_id, "now": timestamp(now)}
    if email_id is not None:
        where += " AND email_id = :email_id"
        params["email_id"] = email_id
    return tx.execute(
        f"UPDATE sandbox_outcomes SET due_at = :now, updated_at = :now WHERE {where}", params
    )


def capture_post(tx: Tx, post: CapturedPost) -> None:
    tx.execute(
        "INSERT INTO sandbox_posts (id, workspace_id, kind, source_id, url, headers, body,"
        " created_at) VALUES (:id, :ws, :kind, :source, :url, :headers, :body, :at)",
        {
            "id": post.id,
            "ws": post.workspace_id,
            "kind": post.kind,
            "source": post.source_id,
            "url": post.url,
            "headers": to_json([list(pair) for pair in post.headers]),
            "body": post.body or b"",
            "at": timestamp(post.created_at),
        },
    )


def _post(row: Row) -> CapturedPost:
    body = row.get("body")
    return CapturedPost(
        id=row["id"],
        workspace_id=row["workspace_id"],
        kind=row["kind"],
        source_id=row["source_id"],
        url=row["url"],
        headers=[(str(name), str(value)) for name, value in from_json(row["headers"])],
        created_at=parse_timestamp(row["created_at"]),
        body=None if body is None else bytes(body),
    )


@in_one_snapshot
def posts_page(
    tx: Tx, workspace_id: str, offset: int, limit: int
) -> tuple[list[CapturedPost], int]:
    """Captured POSTs newest first, and how many there are."""
    params: dict[str, object] = {"ws": workspace_id, "limit": limit, "offset": offset}
    rows = tx.all(
        "SELECT id, workspace_id, kind, source_id, url, headers, created_at FROM sandbox_posts"
        " WHERE workspace_id = :ws ORDER BY created_at DESC, id DESC LIMIT :limit OFFSET :offset",
        params,
    )
    total = int(tx.value("SELECT COUNT(*) FROM sandbox_posts WHERE workspace_id = :ws", params))
    return [_post(row) for row in rows], total


def post(tx: Tx, workspace_id: str, post_id: str) -> CapturedPost | None:
    """One captured POST with its body."""
    row = tx.one(
        "SELECT * FROM sandbox_posts WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": post_id},
    )
    return None if row is None else _post(row)
