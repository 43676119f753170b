"""Destination incidents: a destination blocking, slowing or not resolving for one workspace's
sending domain, shared by every node (engine/delivery/incidents.py decides what they mean).

At most one incident per (workspace, sending domain, destination) is open at a time. While its
`paused_until` is ahead, no node claims that pair's recipients (`PAUSED`, used by the claim in
storage/emails.py); a round with another hit widens it, a round with a delivery and no hit
resolves it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from storage.codec import new_id, parse_optional_timestamp, parse_timestamp, timestamp
from storage.tx import Row, Tx

# A recipient (of `email_recipients`, unaliased) whose email's sending domain has a paused
# open incident at the recipient's domain.
PAUSED = (
    "EXISTS (SELECT 1 FROM emails pe, delivery_incidents pi"
    " WHERE pe.id = email_recipients.email_id AND pi.workspace_id = pe.workspace_id"
    " AND pi.domain_id = pe.domain_id AND pi.destination = email_recipients.domain"
    " AND pi.resolved_at IS NULL AND pi.paused_until > :now)"
)

# When the earliest pause at the destination `:domain` ends (a queue with work held back
# wakes then).
PAUSE_ENDS = (
    "SELECT MIN(paused_until) FROM delivery_incidents WHERE destination = :domain"
    " AND resolved_at IS NULL AND paused_until > :now"
)

Pair = tuple[str, str]  # (workspace id, sending domain id)


@dataclass(frozen=True, slots=True)
class Hit:
    """What one delivery round saw of an incident for one pair: its kind and a sample reply."""

    kind: str
    sending_domain: str
    sample_reply: str


@dataclass(frozen=True, slots=True)
class Incident:
    id: str
    workspace_id: str
    domain_id: str
    sending_domain: str
    destination: str
    kind: str
    strikes: int
    sample_reply: str
    first_seen_at: datetime
    last_seen_at: datetime
    paused_until: datetime
    resolved_at: datetime | None


def _incident(row: Row) -> Incident:
    return Incident(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        sending_domain=row["sending_domain"],
        destination=row["destination"],
        kind=row["kind"],
        strikes=int(row["strikes"]),
        sample_reply=row["sample_reply"],
        first_seen_at=parse_timestamp(row["first_seen_at"]),
        last_seen_at=parse_timestamp(row["last_seen_at"]),
        paused_until=parse_timestamp(row["paused_until"]),
        resolved_at=parse_optional_timestamp(row["resolved_at"]),
    )


def record_round(
    tx: Tx,
    destination: str,
    hits: Mapping[Pair, Hit],
    delivered: set[Pair],
    now: datetime,
    pause_for: Callable[[str, int], timedelta],
) -> None:
    """Open or widen an incident for each pair a round hit (`pause_for(kind, strikes)` says
    for how long it pauses), and resolve the open ones of pairs it delivered to without a
    hit. One read of the destination's open incidents, then one write per pair touched."""
    if not hits and not delivered:
        return
    open_rows = tx.all(
        "SELECT * FROM delivery_incidents WHERE destination = :destination AND resolved_at IS NULL",
        {"destination": destination},
    )
    current = {(row["workspace_id"], row["domain_id"]): _incident(row) for row in open_rows}
    at = timestamp(now)
    for (workspace_id, domain_id), hit in hits.items():
        found = current.get((workspace_id, domain_id))
        strikes = 1 if found is None else found.strikes + 1
        # Another node may open the same incident meanwhile: the partial unique index makes
        # the second insert widen the first one instead.
        tx.run(
            "INSERT INTO delivery_incidents (id, workspace_id, domain_id, sending_domain,"
            " destination, kind, strikes, sample_reply, first_seen_at, last_seen_at,"
            " paused_until) VALUES (:id, :ws, :domain_id, :sending, :destination, :kind,"
            " :strikes, :sample, :now, :now, :until)"
            " ON CONFLICT (workspace_id, domain_id, destination) WHERE resolved_at IS NULL"
            " DO UPDATE SET kind = :kind, strikes = :strikes, sample_reply = :sample,"
            " last_seen_at = :now, paused_until = :until",
            {
                "id": new_id(),
                "ws": workspace_id,
                "domain_id": domain_id,
                "sending": hit.sending_domain,
                "destination": destination,
                "kind": hit.kind,
                "strikes": strikes,
                "sample": hit.sample_reply[:1000],
                "now": at,
                "until": timestamp(now + pause_for(hit.kind, strikes)),
            },
        )
    for workspace_id, domain_id in delivered - set(hits):
        if (workspace_id, domain_id) in current:
            tx.run(
                "UPDATE delivery_incidents SET resolved_at = :now WHERE workspace_id = :ws"
                " AND domain_id = :domain_id AND destination = :destination"
                " AND resolved_at IS NULL",
                {"now": at, "ws": workspace_id, "domain_id": domain_id, "destination": destination},
            )


def of_workspace(tx: Tx, workspace_id: str, state: str, limit: int) -> list[Incident]:
    """The workspace's incidents, most recently seen first: `open`, `resolved` or `all`."""
    where = {"open": " AND resolved_at IS NULL", "resolved": " AND resolved_at IS NOT NULL"}
    rows = tx.all(
        f"SELECT * FROM delivery_incidents WHERE workspace_id = :ws{where.get(state, '')}"
        " ORDER BY last_seen_at DESC, id LIMIT :limit",
        {"ws": workspace_id, "limit": limit},
    )
    return [_incident(row) for row in rows]


def get(tx: Tx, workspace_id: str, incident_id: str) -> Incident | None:
    row = tx.one(
        "SELECT * FROM delivery_incidents WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": incident_id},
    )
    return None if row is None else _incident(row)


def resolve(tx: Tx, incident: Incident, now: datetime) -> bool:
    """Resolve an open incident (its pause ends with it, and the destination's queue wakes
    on every node); False when it was resolved already."""
    done = tx.execute(
        "UPDATE delivery_incidents SET resolved_at = :now WHERE workspace_id = :ws"
        " AND id = :id AND resolved_at IS NULL",
        {"now": timestamp(now), "ws": incident.workspace_id, "id": incident.id},
    )
    if done:
        tx.notify(f"mail:{incident.destination}")
    return done > 0


def open_counts(tx: Tx) -> dict[tuple[str, str], int]:
    """Open incidents of every workspace, by (destination, kind): for /metrics."""
    rows = tx.all(
        "SELECT destination, kind, COUNT(*) AS n FROM delivery_incidents"
        " WHERE resolved_at IS NULL GROUP BY destination, kind"
    )
    return {(row["destination"], row["kind"]): int(row["n"]) for row in rows}
