"""Webhooks and their deliveries.

Deliveries are the outbox of email events: `fan_out` writes one per subscribed active webhook
inside the same unit of work that stores the events (engine/webhooks/outbox.py says which
events and builds their payloads), so an event is never recorded without its deliveries, nor
the other way round. The dispatcher claims due deliveries with a lease. A webhook's signing
secret and basic-auth credentials are sealed at rest (storage/sealing.py) and opened only in
this module's reads.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from storage.codec import (
    from_json,
    in_list,
    new_id,
    parse_optional_timestamp,
    parse_timestamp,
    timestamp,
    to_json,
)
from storage.engines import in_one_snapshot
from storage.leases import Claimed, FaultPolicy, LeasedTable
from storage.sealing import WEBHOOK_BASIC_AUTH, WEBHOOK_SECRET
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class BasicAuth:
    """Credentials a webhook's receiver expects (`Authorization: Basic`), sealed at rest."""

    username: str  # RFC 7617: no colon
    password: str = field(repr=False)

    def header(self) -> str:
        """The `Authorization` header value."""
        pair = f"{self.username}:{self.password}".encode()
        return "Basic " + base64.b64encode(pair).decode("ascii")


@dataclass(frozen=True, slots=True)
class Webhook:
    id: str
    workspace_id: str
    url: str
    events: list[str]
    secret: str
    is_active: bool
    created_at: datetime
    format: str = "postroom"  # the payload profile (engine/webhooks/profiles.py)
    basic_auth: BasicAuth | None = None


@dataclass(frozen=True, slots=True)
class Delivery:
    id: str
    webhook_id: str
    workspace_id: str
    event_type: str
    payload: str  # the exact JSON body that is signed and sent
    endpoint_url: str
    status: str
    attempt: int
    next_retry_at: datetime | None
    response_status: int | None
    response_body: str | None
    created_at: datetime
    # The webhook's format and credentials, read with the delivery only when it is claimed
    # for sending, and its URL now (the credentials are for that URL's origin, which a
    # delivery queued before the URL changed may not share).
    send_format: str = "postroom"
    send_basic_auth: BasicAuth | None = field(default=None, repr=False)
    webhook_url: str = ""
    sandboxed: bool = False  # its workspace is in the sandbox: captured, never sent


@dataclass(frozen=True, slots=True)
class Attempt:
    """The outcome of one POST of a delivery."""

    delivery_id: str
    status: str
    next_retry_at: datetime | None
    response_status: int | None
    response_body: str | None


def _sealed_auth(tx: Tx, webhook_id: str, auth: BasicAuth | None) -> str | None:
    if auth is None:
        return None
    return tx.sealer.seal(WEBHOOK_BASIC_AUTH, webhook_id, f"{auth.username}:{auth.password}")


def _opened_auth(tx: Tx, webhook_id: str, stored: str | None) -> BasicAuth | None:
    if stored is None:
        return None
    username, _, password = tx.sealer.unseal(WEBHOOK_BASIC_AUTH, webhook_id, stored).partition(":")
    return BasicAuth(username, password)


def _webhook(tx: Tx, row: Row) -> Webhook:
    return Webhook(
        id=row["id"],
        workspace_id=row["workspace_id"],
        url=row["url"],
        events=from_json(row["events"]),
        secret=tx.sealer.unseal(WEBHOOK_SECRET, row["id"], row["secret"]),
        is_active=bool(row["is_active"]),
        created_at=parse_timestamp(row["created_at"]),
        format=row["format"],
        basic_auth=_opened_auth(tx, row["id"], row["basic_auth"]),
    )


def _delivery(row: Row) -> Delivery:
    return Delivery(
        id=row["id"],
        webhook_id=row["webhook_id"],
        workspace_id=row["workspace_id"],
        event_type=row["event_type"],
        payload=row["payload"],
        endpoint_url=row["endpoint_url"],
        status=row["status"],
        attempt=int(row["attempt"]),
        next_retry_at=parse_optional_timestamp(row["next_retry_at"]),
        response_status=row["response_status"],
        response_body=row["response_body"],
        created_at=parse_timestamp(row["created_at"]),
    )


def insert(tx: Tx, webhook: Webhook) -> None:
    tx.execute(
        "INSERT INTO webhooks (id, workspace_id, url, events, secret, is_active, format,"
        " basic_auth, created_at, updated_at) VALUES (:id, :ws, :url, :events, :secret, :active,"
        " :format, :auth, :at, :at)",
        {
            "id": webhook.id,
            "ws": webhook.workspace_id,
            "url": webhook.url,
            "events": to_json(webhook.events),
            "secret": tx.sealer.seal(WEBHOOK_SECRET, webhook.id, webhook.secret),
            "active": webhook.is_active,
            "format": webhook.format,
            "auth": _sealed_auth(tx, webhook.id, webhook.basic_auth),
            "at": timestamp(webhook.created_at),
        },
    )


def get(tx: Tx, workspace_id: str, webhook_id: str) -> Webhook | None:
    row = tx.one(
        "SELECT * FROM webhooks WHERE workspace_id = :ws AND id = :id AND deleted_at IS NULL",
        {"ws": workspace_id, "id": webhook_id},
    )
    return None if row is None else _webhook(tx, row)


def list_active(tx: Tx, workspace_id: str) -> list[Webhook]:
    return active_of(tx, [workspace_id])().get(workspace_id, [])


def active_of(tx: Tx, workspace_ids: Collection[str]) -> Callable[[], dict[str, list[Webhook]]]:
    """The active webhooks of each of `workspace_ids` (oldest first), read later: sent now
    and read when the result is called (`Tx.later`), so that a write knowing its events'
    workspaces ahead reads them with the statement before them in one round trip."""
    if not workspace_ids:
        return dict
    names, params = in_list("ws", workspace_ids)
    rows = tx.later(
        f"SELECT * FROM webhooks WHERE workspace_id IN ({names}) AND is_active"
        " AND deleted_at IS NULL ORDER BY created_at, id",
        params,
    )

    def read() -> dict[str, list[Webhook]]:
        found: dict[str, list[Webhook]] = {}
        for row in rows():
            found.setdefault(row["workspace_id"], []).append(_webhook(tx, row))
        return found

    return read


def update(tx: Tx, webhook: Webhook, now: datetime) -> None:
    tx.execute(
        "UPDATE webhooks SET url = :url, events = :events, is_active = :active,"
        " format = :format, basic_auth = :auth, updated_at = :at WHERE id = :id",
        {
            "format": webhook.format,
            "auth": _sealed_auth(tx, webhook.id, webhook.basic_auth),
            "url": webhook.url,
            "events": to_json(webhook.events),
            "active": webhook.is_active,
            "at": timestamp(now),
            "id": webhook.id,
        },
    )


def delete(tx: Tx, webhook_id: str, now: datetime) -> None:
    """Retire a webhook; its deliveries stay readable, pending ones are dropped."""
    tx.execute(
        "UPDATE webhooks SET deleted_at = :at, is_active = FALSE WHERE id = :id",
        {"at": timestamp(now), "id": webhook_id},
    )
    tx.execute(
        "UPDATE webhook_deliveries SET status = 'dead', next_retry_at = NULL, updated_at = :at"
        " WHERE webhook_id = :id AND status IN ('pending', 'retrying')",
        {"at": timestamp(now), "id": webhook_id},
    )


def fan_out(
    tx: Tx,
    workspace_id: str,
    items: Sequence[tuple[str, str]],
    now: datetime,
    hooks: Sequence[Webhook] | None = None,
) -> int:
    """Queue a delivery of each (event type, payload) to every active subscribed webhook
    (`hooks`: the workspace's `list_active`, when the caller has them already)."""
    if hooks is None:
        hooks = list_active(tx, workspace_id)
    rows = [
        {
            "id": new_id(),
            "webhook": hook.id,
            "ws": workspace_id,
            "type": event_type,
            "payload": payload,
            "url": hook.url,
            "at": timestamp(now),
        }
        for event_type, payload in items
        for hook in hooks
        if event_type in hook.events
    ]
    if not rows:
        return 0
    tx.execute_many(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_type, payload,"
        " endpoint_url, status, attempt, next_retry_at, created_at, updated_at) VALUES (:id,"
        " :webhook, :ws, :type, :payload, :url, 'pending', 0, :at, :at, :at)",
        rows,
    )
    tx.notify("webhooks")
    return len(rows)


def queue_one(tx: Tx, webhook: Webhook, event_type: str, payload: str, now: datetime) -> str:
    """Queue a single delivery to one webhook (the test endpoint); its id."""
    delivery_id = new_id()
    tx.notify("webhooks")
    tx.execute(
        "INSERT INTO webhook_deliveries (id, webhook_id, workspace_id, event_type, payload,"
        " endpoint_url, status, attempt, next_retry_at, created_at, updated_at) VALUES (:id,"
        " :webhook, :ws, :type, :payload, :url, 'pending', 0, :at, :at, :at)",
        {
            "id": delivery_id,
            "webhook": webhook.id,
            "ws": webhook.workspace_id,
            "type": event_type,
            "payload": payload,
            "url": webhook.url,
            "at": timestamp(now),
        },
    )
    return delivery_id


@in_one_snapshot
def deliveries_page(
    tx: Tx, workspace_id: str, webhook_id: str, status: str | None, offset: int, limit: int
) -> tuple[list[Delivery], int]:
    where = "workspace_id = :ws AND webhook_id = :hook"
    params: dict[str, Any] = {
        "ws": workspace_id,
        "hook": webhook_id,
        "limit": limit,
        "offset": offset,
    }
    if status is not None:
        where += " AND status = :status"
        params["status"] = status
    total = int(tx.value(f"SELECT COUNT(*) FROM webhook_deliveries WHERE {where}", params))
    rows = tx.all(
        f"SELECT * FROM webhook_deliveries WHERE {where} ORDER BY created_at DESC, id DESC"
        " LIMIT :limit OFFSET :offset",
        params,
    )
    return [_delivery(row) for row in rows], total


def get_delivery(tx: Tx, workspace_id: str, delivery_id: str) -> Delivery | None:
    row = tx.one(
        "SELECT * FROM webhook_deliveries WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": delivery_id},
    )
    return None if row is None else _delivery(row)


def replay(tx: Tx, delivery_id: str, now: datetime) -> None:
    tx.execute(
        "UPDATE webhook_deliveries SET status = 'pending', attempt = 0, next_retry_at = :at,"
        " faults = 0, last_fault = NULL, updated_at = :at WHERE id = :id",
        {"at": timestamp(now), "id": delivery_id},
    )
    tx.notify("webhooks")


@dataclass(frozen=True, slots=True)
class ReplayFilter:
    """Which deliveries of one webhook a bulk replay takes: by status, by when they were
    created (`since` inclusive, `until` exclusive) and by event type (empty: any)."""

    webhook_id: str
    status: str
    since: datetime | None
    until: datetime | None
    event_types: tuple[str, ...]


def replay_matching(
    tx: Tx, workspace_id: str, match: ReplayFilter, now: datetime, dry_run: bool
) -> int:
    """Queue again every delivery `match` takes, as fresh first attempts (with `dry_run`,
    only count them); how many. One statement each, whatever their number."""
    where = "workspace_id = :ws AND webhook_id = :hook AND status = :status"
    params: dict[str, Any] = {
        "ws": workspace_id,
        "hook": match.webhook_id,
        "status": match.status,
        "at": timestamp(now),
    }
    if match.since is not None:
        where += " AND created_at >= :since"
        params["since"] = timestamp(match.since)
    if match.until is not None:
        where += " AND created_at < :until"
        params["until"] = timestamp(match.until)
    if match.event_types:
        names = [f"type{i}" for i in range(len(match.event_types))]
        where += f" AND event_type IN ({', '.join(':' + n for n in names)})"
        params.update(zip(names, match.event_types, strict=True))
    if dry_run:
        return int(tx.value(f"SELECT COUNT(*) FROM webhook_deliveries WHERE {where}", params))
    count = tx.execute(
        "UPDATE webhook_deliveries SET status = 'pending', attempt = 0, next_retry_at = :at,"
        f" faults = 0, last_fault = NULL, updated_at = :at WHERE {where}",
        params,
    )
    if count:
        tx.notify("webhooks")
    return count


# A quarantined delivery is dead, with the error where its log shows the receiver's answer.
DELIVERIES = LeasedTable("webhook_deliveries", "next_retry_at", "dead", "response_body")


Opened = dict[str, tuple[str, BasicAuth | None]]  # webhook id -> its secret and credentials


def _with_secret(tx: Tx, row: Row, opened: Opened) -> tuple[Delivery, str]:
    webhook_id = row["webhook_id"]
    if webhook_id not in opened:  # a claim opens each webhook's secrets once, not per delivery
        opened[webhook_id] = (
            tx.sealer.unseal(WEBHOOK_SECRET, webhook_id, row["webhook_secret"]),
            _opened_auth(tx, webhook_id, row["webhook_basic_auth"]),
        )
    secret, auth = opened[webhook_id]
    delivery = replace(
        _delivery(row),
        send_format=row["webhook_format"],
        send_basic_auth=auth,
        webhook_url=row["webhook_url"],
        sandboxed=bool(row["workspace_sandbox"]),
    )
    return delivery, secret


def claim_due(
    tx: Tx, now: datetime, lease_until: datetime, node: str, limit: int, faults: FaultPolicy
) -> Claimed[tuple[Delivery, str]]:
    """Lease due deliveries, each with its webhook's secret (and format, credentials, URL and
    whether its workspace is in the sandbox)."""
    opened: Opened = {}
    return DELIVERIES.claim_due(
        tx,
        now,
        lease_until,
        node,
        limit,
        lambda row: _with_secret(tx, row, opened),
        faults,
        join=" JOIN webhooks w ON w.id = q.webhook_id JOIN workspaces ws ON ws.id = q.workspace_id",
        also=", w.secret AS webhook_secret, w.format AS webhook_format,"
        " w.basic_auth AS webhook_basic_auth, w.url AS webhook_url,"
        " ws.sandbox AS workspace_sandbox",
    )


def record_attempts(tx: Tx, attempts: Sequence[Attempt], now: datetime, holder: str) -> None:
    """Record attempts of deliveries `holder` still leases: a node declared dead while it
    POSTed (its leases freed, the delivery perhaps sent and recorded by another node since)
    must not overwrite what that node recorded."""
    tx.execute_many(
        "UPDATE webhook_deliveries SET status = :status, attempt = attempt + 1,"
        " next_retry_at = :next, response_status = :code, response_body = :body,"
        " lease_until = NULL, leased_by = NULL, updated_at = :at"
        " WHERE id = :id AND leased_by = :holder",
        (
            {
                "holder": holder,
                "status": a.status,
                "next": None if a.next_retry_at is None else timestamp(a.next_retry_at),
                "code": a.response_status,
                "body": a.response_body,
                "at": timestamp(now),
                "id": a.delivery_id,
            }
            for a in attempts
        ),
    )
