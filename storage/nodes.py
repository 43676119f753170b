"""Nodes sharing the database, and everything a node holds by lease.

A node is registered at start and beats while it runs; each beat renews every lease the node
holds, in every table that has them (`HELD`). Reaping a dead node frees all of them at once,
so its work is taken over without waiting for a lease to lapse; a node that stops cleanly
gives back only its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.tx import Row, Tx

ALIVE, STOPPED, DEAD = "alive", "stopped", "dead"


@dataclass(frozen=True, slots=True)
class Held:
    """A table whose rows a node holds: the column naming the node, and the lease's end."""

    table: str
    holder: str
    until: str


# Every lease there is. Work rows keep their row when released (the lease columns are
# cleared); slots, leaderships and claims are rows of their own.
HELD = (
    Held("email_recipients", "leased_by", "lease_until"),
    Held("webhook_deliveries", "leased_by", "lease_until"),
    Held("forward_jobs", "leased_by", "lease_until"),
    Held("destination_slots", "held_by", "lease_until"),
    Held("leaderships", "held_by", "lease_until"),
    Held("sandbox_outcomes", "leased_by", "lease_until"),
)
CLAIMS = Held("idempotency_claims", "claimed_by", "claimed_until")


@dataclass(frozen=True, slots=True)
class Node:
    id: str
    host: str
    pid: int
    state: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    role: str  # all, intake or delivery (postroom/workers.py)


@dataclass(frozen=True, slots=True)
class Holdings:
    """How much a node holds now, by table."""

    node_id: str
    counts: dict[str, int]


def _node(row: Row) -> Node:
    return Node(
        id=row["id"],
        host=row["host"],
        pid=int(row["pid"]),
        state=row["state"],
        started_at=parse_timestamp(row["started_at"]),
        heartbeat_at=parse_timestamp(row["heartbeat_at"]),
        stopped_at=parse_optional_timestamp(row["stopped_at"]),
        role=row["role"],
    )


def register(
    tx: Tx, node_id: str, host: str, pid: int, role: str, instance: str | None, now: datetime
) -> None:
    """A node joins; `instance` names the workers of one `serve --workers N` it is one of."""
    tx.execute(
        "INSERT INTO nodes (id, host, pid, role, instance, state, started_at, heartbeat_at)"
        " VALUES (:id, :host, :pid, :role, :instance, :state, :now, :now)",
        {
            "id": node_id,
            "host": host,
            "pid": pid,
            "role": role,
            "instance": instance,
            "state": ALIVE,
            "now": timestamp(now),
        },
    )


def revive(tx: Tx, node_id: str, now: datetime) -> None:
    """Mark a node that was declared dead alive again (it was only silent)."""
    tx.execute(
        "UPDATE nodes SET state = :alive, stopped_at = NULL, heartbeat_at = :now WHERE id = :id",
        {"alive": ALIVE, "now": timestamp(now), "id": node_id},
    )


def beat(tx: Tx, node_id: str, now: datetime, leases_until: datetime, metrics: str | None) -> bool:
    """Record a heartbeat with the node's process metrics (published for its instance's
    /metrics) and renew every lease the node holds; False when other nodes have declared this
    one dead meanwhile (its leases were freed: it must not go on as before)."""
    alive = tx.execute(
        "UPDATE nodes SET heartbeat_at = :now, metrics = :metrics WHERE id = :id AND state = :alive",
        {"now": timestamp(now), "metrics": metrics, "id": node_id, "alive": ALIVE},
    )
    if not alive:
        return False
    until = timestamp(leases_until)
    for held in (*HELD, CLAIMS):
        tx.execute(
            f"UPDATE {held.table} SET {held.until} = :until WHERE {held.holder} = :node",
            {"until": until, "node": node_id},
        )
    return True


def release(tx: Tx, node_id: str, tables: tuple[str, ...] | None = None) -> int:
    """Give back everything `node_id` holds, or only its leases in `tables` (an actor starting
    again after a fault: nothing of the node works those rows any more, while its heartbeat
    would renew their leases for as long as it lives); how many leases that was."""
    released = 0
    for held in HELD:
        if tables is not None and held.table not in tables:
            continue
        if held.table == "email_recipients":
            # The mail goes back to the queue: wake the nodes delivering to its domains.
            for row in tx.all(
                "SELECT DISTINCT domain FROM email_recipients WHERE leased_by = :node",
                {"node": node_id},
            ):
                tx.notify(f"mail:{row['domain']}")
        released += tx.execute(
            f"UPDATE {held.table} SET {held.holder} = NULL, {held.until} = NULL"
            f" WHERE {held.holder} = :node",
            {"node": node_id},
        )
    if tables is None:
        tx.execute(f"DELETE FROM {CLAIMS.table} WHERE {CLAIMS.holder} = :node", {"node": node_id})
    return released


def declared_dead(tx: Tx, node_id: str) -> bool:
    """Whether other nodes declared `node_id` dead (freeing what it held) and it has not beaten
    since: it must claim nothing until it has. Locks the node's row until the transaction ends,
    so a claim and a reap of the same node never overlap."""
    lock = tx.row_lock("FOR SHARE")
    state = tx.value(f"SELECT state FROM nodes WHERE id = :id{lock}", {"id": node_id})
    return state is not None and state != ALIVE


def stop(tx: Tx, node_id: str, now: datetime) -> int:
    """A clean stop: give back the node's own leases; how many."""
    tx.execute(
        "UPDATE nodes SET state = :stopped, stopped_at = :now WHERE id = :id",
        {"stopped": STOPPED, "now": timestamp(now), "id": node_id},
    )
    return release(tx, node_id)


def reap(tx: Tx, silent_since: datetime, now: datetime) -> list[str]:
    """Declare dead every node whose last beat is older than `silent_since`, freeing all it
    held; their ids. Two nodes reaping at once free each dead node once."""
    rows = tx.all(
        "SELECT id FROM nodes WHERE state = :alive AND heartbeat_at < :since",
        {"alive": ALIVE, "since": timestamp(silent_since)},
    )
    reaped = []
    for row in rows:
        declared = tx.execute(
            "UPDATE nodes SET state = :dead, stopped_at = :now WHERE id = :id AND state = :alive",
            {"dead": DEAD, "now": timestamp(now), "id": row["id"], "alive": ALIVE},
        )
        if declared:
            release(tx, row["id"])
            reaped.append(str(row["id"]))
    return reaped


def forget_before(tx: Tx, before: datetime) -> int:
    """Drop nodes that ended before `before` (the list stays short)."""
    return tx.execute(
        "DELETE FROM nodes WHERE state <> :alive AND stopped_at < :before",
        {"alive": ALIVE, "before": timestamp(before)},
    )


def listed(tx: Tx) -> list[tuple[Node, Holdings]]:
    """Every known node, newest first, with what each holds now."""
    # Not `metrics`: the figures each beat publishes are for /metrics, not for this list.
    rows = tx.all(
        "SELECT id, host, pid, state, started_at, heartbeat_at, stopped_at, role FROM nodes"
        " ORDER BY started_at DESC, id"
    )
    nodes = [_node(row) for row in rows]
    counts: dict[str, dict[str, int]] = {node.id: {} for node in nodes}
    for held in (*HELD, CLAIMS):
        for row in tx.all(
            f"SELECT {held.holder} AS node, COUNT(*) AS n FROM {held.table}"
            f" WHERE {held.holder} IS NOT NULL GROUP BY {held.holder}"
        ):
            if row["node"] in counts:
                counts[row["node"]][held.table] = int(row["n"])
    return [(node, Holdings(node.id, counts[node.id])) for node in nodes]


def instance_metrics(tx: Tx, instance: str, node_id: str) -> list[str]:
    """What the other live nodes of `instance` published with their last beat."""
    rows = tx.all(
        "SELECT metrics FROM nodes WHERE instance = :instance AND id <> :id AND state = :alive"
        " AND metrics IS NOT NULL",
        {"instance": instance, "id": node_id, "alive": ALIVE},
    )
    return [str(row["metrics"]) for row in rows]


def alive(tx: Tx) -> list[str]:
    """The ids of the nodes now alive."""
    return [row["id"] for row in tx.all("SELECT id FROM nodes WHERE state = :s", {"s": ALIVE})]
