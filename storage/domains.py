"""Sending domains with their DKIM keys, and the sender addresses on them.

A domain's DKIM private keys (RSA, and Ed25519 once made) are sealed at rest
(storage.sealing): sealed here on write and unsealed on read, so a `Domain` holds them as PEM.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from storage.codec import from_json, parse_optional_timestamp, parse_timestamp, timestamp, to_json
from storage.sealing import DKIM_PRIVATE_KEY, ED25519_PRIVATE_KEY
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Domain:
    id: str
    workspace_id: str
    name: str
    status: str
    dkim_selector: str
    dkim_private_key: str
    dkim_public_key: str
    record_status: dict[str, str]
    open_tracking: bool
    click_tracking: bool
    created_at: datetime
    verified_at: datetime | None
    bimi_svg: str | None = None
    bimi_enabled: bool = False
    # Verified by the sandbox's mark, without DNS: valid only while its workspace is sandboxed.
    sandbox_verified: bool = False
    # A second DKIM key (RFC 8463), signed with beside RSA while `ed25519_signing` is on.
    ed25519_selector: str | None = None
    ed25519_private_key: str | None = None
    ed25519_public_key: str | None = None
    ed25519_signing: bool = False
    tags_header: str | None = None  # the header its mail carries tags in; None: not sent
    # Per record purpose, what the last check found beside the status (why, the record to
    # publish instead, parsed facts): engine/domains/findings.py.
    record_findings: dict[str, dict[str, Any]] = field(default_factory=dict)
    # The domain its envelope sender is on once that domain's records check out
    # (engine/domains/bounce_domain.py); None: the domain itself.
    bounce_domain: str | None = None
    tracking_host: str | None = None  # its own host for tracking links (a CNAME to ours)
    # Since when its mail that offers unsubscribe is stopped (engine/contacts/complaint_guard.py).
    marketing_stopped_at: datetime | None = None


@dataclass(frozen=True, slots=True)
class Sender:
    id: str
    workspace_id: str
    domain_id: str
    email: str
    name: str | None
    is_active: bool
    created_at: datetime


def _domain(tx: Tx, row: Row) -> Domain:
    return Domain(
        id=row["id"],
        workspace_id=row["workspace_id"],
        name=row["name"],
        status=row["status"],
        dkim_selector=row["dkim_selector"],
        dkim_private_key=tx.sealer.unseal(DKIM_PRIVATE_KEY, row["id"], row["dkim_private_key"]),
        dkim_public_key=row["dkim_public_key"],
        record_status=from_json(row["record_status"]),
        open_tracking=bool(row["open_tracking"]),
        click_tracking=bool(row["click_tracking"]),
        created_at=parse_timestamp(row["created_at"]),
        verified_at=parse_optional_timestamp(row["verified_at"]),
        bimi_svg=row["bimi_svg"],
        bimi_enabled=bool(row["bimi_enabled"]),
        sandbox_verified=bool(row["sandbox_verified"]),
        ed25519_selector=row["ed25519_selector"],
        ed25519_private_key=(
            None
            if row["ed25519_private_key"] is None
            else tx.sealer.unseal(ED25519_PRIVATE_KEY, row["id"], row["ed25519_private_key"])
        ),
        ed25519_public_key=row["ed25519_public_key"],
        ed25519_signing=bool(row["ed25519_signing"]),
        tags_header=row["tags_header"],
        record_findings=from_json(row["record_findings"]),
        bounce_domain=row["bounce_domain"],
        tracking_host=row["tracking_host"],
        marketing_stopped_at=parse_optional_timestamp(row.get("marketing_stopped_at")),
    )


def _sender(row: Row) -> Sender:
    return Sender(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        email=row["email"],
        name=row["name"],
        is_active=bool(row["is_active"]),
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(tx: Tx, domain: Domain) -> None:
    tx.execute(
        "INSERT INTO domains (id, workspace_id, name, status, dkim_selector, dkim_private_key,"
        " dkim_public_key, record_status, open_tracking, click_tracking, created_at,"
        " pending_since)"
        " VALUES (:id, :ws, :name, :status, :selector, :private, :public, :records,"
        " :open, :click, :created_at, :created_at)",
        {
            "id": domain.id,
            "ws": domain.workspace_id,
            "name": domain.name,
            "status": domain.status,
            "selector": domain.dkim_selector,
            "private": tx.sealer.seal(DKIM_PRIVATE_KEY, domain.id, domain.dkim_private_key),
            "public": domain.dkim_public_key,
            "records": to_json(domain.record_status),
            "open": domain.open_tracking,
            "click": domain.click_tracking,
            "created_at": timestamp(domain.created_at),
        },
    )


def count(tx: Tx, workspace_id: str) -> int:
    return int(
        tx.value("SELECT COUNT(*) FROM domains WHERE workspace_id = :ws", {"ws": workspace_id})
    )


def get(tx: Tx, workspace_id: str, domain_id: str) -> Domain | None:
    row = tx.one(
        "SELECT * FROM domains WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": domain_id},
    )
    return None if row is None else _domain(tx, row)


def by_name(tx: Tx, workspace_id: str, name: str) -> Domain | None:
    row = tx.one(
        "SELECT * FROM domains WHERE workspace_id = :ws AND name = :name",
        {"ws": workspace_id, "name": name},
    )
    return None if row is None else _domain(tx, row)


def list_all(tx: Tx, workspace_id: str) -> list[Domain]:
    rows = tx.all(
        "SELECT * FROM domains WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_domain(tx, row) for row in rows]


def by_id(tx: Tx, domain_id: str) -> Domain | None:
    """A domain by id alone (for public endpoints where the id is all there is)."""
    row = tx.one("SELECT * FROM domains WHERE id = :id", {"id": domain_id})
    return None if row is None else _domain(tx, row)


def set_bimi_logo(tx: Tx, domain_id: str, svg: str) -> None:
    tx.execute("UPDATE domains SET bimi_svg = :svg WHERE id = :id", {"svg": svg, "id": domain_id})


def enable_bimi(tx: Tx, domain_id: str) -> None:
    tx.execute("UPDATE domains SET bimi_enabled = TRUE WHERE id = :id", {"id": domain_id})


def pending_since(tx: Tx, after: datetime) -> list[Domain]:
    """Every workspace's domains that became pending (registered or re-keyed) after a time."""
    rows = tx.all(
        "SELECT * FROM domains WHERE status = 'pending' AND pending_since > :after"
        " ORDER BY pending_since, id",
        {"after": timestamp(after)},
    )
    return [_domain(tx, row) for row in rows]


def verified_elsewhere(tx: Tx, workspace_id: str, name: str) -> list[Domain]:
    """Other workspaces' domains of this name that are verified (at most one: the index
    `domains_verified_name`), by DNS or by a sandbox mark."""
    rows = tx.all(
        "SELECT * FROM domains WHERE name = :name AND status = 'verified' AND workspace_id <> :ws",
        {"name": name, "ws": workspace_id},
    )
    return [_domain(tx, row) for row in rows]


def record_check(
    tx: Tx,
    domain_id: str,
    status: str,
    record_status: dict[str, str],
    checked_at: datetime,
    verified_at: datetime | None,
    sandbox_verified: bool,
    record_findings: dict[str, dict[str, Any]] | None = None,
) -> None:
    tx.execute(
        "UPDATE domains SET status = :status, record_status = :records, checked_at = :checked,"
        " verified_at = :verified, sandbox_verified = :marked, record_findings = :findings"
        " WHERE id = :id",
        {
            "findings": to_json(record_findings or {}),
            "marked": sandbox_verified,
            "status": status,
            "records": to_json(record_status),
            "checked": timestamp(checked_at),
            "verified": None if verified_at is None else timestamp(verified_at),
            "id": domain_id,
        },
    )


def set_tracking(tx: Tx, domain_id: str, open_tracking: bool, click_tracking: bool) -> None:
    tx.execute(
        "UPDATE domains SET open_tracking = :open, click_tracking = :click WHERE id = :id",
        {"open": open_tracking, "click": click_tracking, "id": domain_id},
    )


def set_ed25519_key(tx: Tx, domain_id: str, selector: str, private_pem: str, public: str) -> None:
    """Give a domain its Ed25519 key (made once; kept when signing is turned off)."""
    tx.execute(
        "UPDATE domains SET ed25519_selector = :selector, ed25519_private_key = :private,"
        " ed25519_public_key = :public WHERE id = :id",
        {
            "selector": selector,
            "private": tx.sealer.seal(ED25519_PRIVATE_KEY, domain_id, private_pem),
            "public": public,
            "id": domain_id,
        },
    )


def set_mail_options(
    tx: Tx, domain_id: str, ed25519_signing: bool, tags_header: str | None
) -> None:
    tx.execute(
        "UPDATE domains SET ed25519_signing = :ed25519, tags_header = :tags WHERE id = :id",
        {"ed25519": ed25519_signing, "tags": tags_header, "id": domain_id},
    )


def set_tracking_host(
    tx: Tx, domain_id: str, host: str | None, record_status: dict[str, str]
) -> None:
    """A new tracking host (None: none), with the record statuses that go with it."""
    tx.execute(
        "UPDATE domains SET tracking_host = :host, record_status = :records WHERE id = :id",
        {"host": host, "records": to_json(record_status), "id": domain_id},
    )


def delete(tx: Tx, domain_id: str) -> None:
    tx.execute("DELETE FROM senders WHERE domain_id = :id", {"id": domain_id})
    tx.execute("DELETE FROM postmaster_mail WHERE domain_id = :id", {"id": domain_id})
    tx.execute("DELETE FROM dmarc_records WHERE domain_id = :id", {"id": domain_id})
    tx.execute("DELETE FROM tls_report_policies WHERE domain_id = :id", {"id": domain_id})
    tx.execute("DELETE FROM domains WHERE id = :id", {"id": domain_id})


def insert_sender(tx: Tx, sender: Sender) -> None:
    tx.execute(
        "INSERT INTO senders (id, workspace_id, domain_id, email, name, is_active, created_at)"
        " VALUES (:id, :ws, :domain_id, :email, :name, TRUE, :created_at)",
        {
            "id": sender.id,
            "ws": sender.workspace_id,
            "domain_id": sender.domain_id,
            "email": sender.email,
            "name": sender.name,
            "created_at": timestamp(sender.created_at),
        },
    )


def sender_by_email(tx: Tx, workspace_id: str, email: str) -> Sender | None:
    row = tx.one(
        "SELECT * FROM senders WHERE workspace_id = :ws AND email = :email",
        {"ws": workspace_id, "email": email},
    )
    return None if row is None else _sender(row)


def get_sender(tx: Tx, workspace_id: str, sender_id: str) -> Sender | None:
    row = tx.one(
        "SELECT * FROM senders WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": sender_id},
    )
    return None if row is None else _sender(row)


def list_senders(tx: Tx, workspace_id: str) -> list[Sender]:
    rows = tx.all(
        "SELECT * FROM senders WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_sender(row) for row in rows]


def delete_sender(tx: Tx, sender_id: str) -> None:
    tx.execute("DELETE FROM senders WHERE id = :id", {"id": sender_id})


def set_bounce_domain(
    tx: Tx,
    domain_id: str,
    bounce_domain: str | None,
    record_status: dict[str, str],
    now: datetime,
) -> None:
    """Give a domain its bounce domain (None: none), with the record statuses that leaves."""
    tx.execute(
        "UPDATE domains SET bounce_domain = :bounce, record_status = :records,"
        " bounce_domain_set_at = :now WHERE id = :id",
        {
            "bounce": bounce_domain,
            "records": to_json(record_status),
            "now": timestamp(now),
            "id": domain_id,
        },
    )


def verified_with_bounce_domain_since(tx: Tx, after: datetime) -> list[Domain]:
    """Every workspace's verified domains given a bounce domain after a time."""
    rows = tx.all(
        "SELECT * FROM domains WHERE status = 'verified' AND bounce_domain IS NOT NULL"
        " AND bounce_domain_set_at > :after ORDER BY bounce_domain_set_at, id",
        {"after": timestamp(after)},
    )
    return [_domain(tx, row) for row in rows]


def verified_serving(tx: Tx, names: Sequence[str]) -> list[Domain]:
    """The verified domains (of any workspace) named, or whose bounce domain is named."""
    if not names:
        return []
    params = {f"n{i}": name for i, name in enumerate(names)}
    listed = ", ".join(f":{key}" for key in params)
    rows = tx.all(
        f"SELECT * FROM domains WHERE status = 'verified' AND (name IN ({listed})"
        f" OR bounce_domain IN ({listed})) ORDER BY created_at, id",
        params,
    )
    return [_domain(tx, row) for row in rows]


def set_marketing_stopped(
    tx: Tx, workspace_id: str, domain_id: str, since: datetime | None
) -> None:
    """Stop the domain's mail that offers unsubscribe (since a time), or (None) let it go."""
    tx.execute(
        "UPDATE domains SET marketing_stopped_at = :since WHERE workspace_id = :ws AND id = :id",
        {"since": None if since is None else timestamp(since), "ws": workspace_id, "id": domain_id},
    )
