"""Connection slots per destination, shared by every node: a delivery round holds one slot per
SMTP connection it opens, so the connections to one destination across the cluster never
exceed its limit. Slots are leased like work rows (renewed by the holder's heartbeat, freed
when it dies), created on first use, and claimed with `SKIP LOCKED` on PostgreSQL.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from storage.codec import timestamp
from storage.nodes import ALIVE
from storage.tx import Tx


def _free(tx: Tx, destination: str, limit: int, wanted: int, now: datetime) -> list[int]:
    lock = tx.row_lock("FOR UPDATE SKIP LOCKED")
    rows = tx.all(
        "SELECT slot FROM destination_slots WHERE destination = :d AND slot < :limit"
        " AND (held_by IS NULL OR lease_until < :now) ORDER BY slot LIMIT :wanted" + lock,
        {"d": destination, "limit": limit, "wanted": wanted, "now": timestamp(now)},
    )
    return [int(row["slot"]) for row in rows]


def acquire(
    tx: Tx,
    destination: str,
    limit: int,
    wanted: int,
    node: str,
    now: datetime,
    until: datetime,
) -> list[int]:
    """Hold up to `wanted` of the destination's `limit` slots for `node`; the slots held."""
    slots = _free(tx, destination, limit, wanted, now)
    if len(slots) < wanted:
        existing = int(
            tx.value(
                "SELECT COUNT(*) FROM destination_slots WHERE destination = :d AND slot < :limit",
                {"d": destination, "limit": limit},
            )
        )
        if existing < limit:  # first use, or a limit raised since: create the missing slots
            tx.execute_many(
                "INSERT INTO destination_slots (destination, slot) VALUES (:d, :slot)"
                " ON CONFLICT (destination, slot) DO NOTHING",
                ({"d": destination, "slot": slot} for slot in range(limit)),
            )
            slots = _free(tx, destination, limit, wanted, now)
    tx.execute_many(
        "UPDATE destination_slots SET held_by = :node, lease_until = :until"
        " WHERE destination = :d AND slot = :slot",
        (
            {"node": node, "until": timestamp(until), "d": destination, "slot": slot}
            for slot in slots
        ),
    )
    return slots


def release(
    tx: Tx, destination: str, slots: Sequence[int], node: str, *, announce: bool = True
) -> None:
    """Give back slots `node` held; nodes waiting for them are woken unless `announce` is
    off (slots taken and given back in one transaction were never seen taken)."""
    if not slots:
        return
    tx.execute_many(
        "UPDATE destination_slots SET held_by = NULL, lease_until = NULL"
        " WHERE destination = :d AND slot = :slot AND held_by = :node",
        ({"d": destination, "slot": slot, "node": node} for slot in slots),
    )
    # A group of domains behind one MX (`mx:` keys) has no one queue to wake: its queues
    # look again every second while they wait.
    if announce and not destination.startswith("mx:"):
        tx.notify(f"mail:{destination}")


def held(tx: Tx, destination: str, now: datetime) -> int:
    """How many of the destination's slots are held now (by any node)."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM destination_slots WHERE destination = :d"
            " AND held_by IS NOT NULL AND lease_until >= :now",
            {"d": destination, "now": timestamp(now)},
        )
    )


def sites_held(tx: Tx, node: str, destination: str, now: datetime) -> tuple[int | None, list[int]]:
    """How many destinations other than `destination` `node` holds slots at now (None: it holds
    one of `destination`'s too), and as many for each other live node that delivers (one
    holding none: 0; intake workers deliver nothing: absent)."""
    rows = tx.all(
        "SELECT n.id AS node, COUNT(DISTINCT s.destination) AS sites,"
        " COUNT(CASE WHEN s.destination = :d THEN 1 END) AS here FROM nodes n"
        " LEFT JOIN destination_slots s ON s.held_by = n.id AND s.lease_until >= :now"
        " WHERE n.state = :alive AND n.role <> 'intake' GROUP BY n.id",
        {"now": timestamp(now), "d": destination, "alive": ALIVE},
    )
    mine: int | None = 0
    others = []
    for row in rows:
        here = int(row["here"]) > 0
        sites = int(row["sites"]) - here
        if row["node"] != node:
            others.append(sites)
        else:
            mine = None if here else sites
    return mine, others
