"""Leaderships: work one node at a time does for all, held by lease (renewed by the holder's
heartbeat, freed when it dies or stops), so it moves to another node by itself."""

from __future__ import annotations

from datetime import datetime

from storage.codec import timestamp
from storage.tx import Tx


def hold(tx: Tx, name: str, node: str, now: datetime, until: datetime) -> bool:
    """Take or keep the leadership `name` for `node` unless another live lease holds it;
    whether `node` holds it now."""
    tx.execute(
        "INSERT INTO leaderships (name, held_by, lease_until) VALUES (:name, :node, :until)"
        " ON CONFLICT (name) DO UPDATE SET held_by = :node, lease_until = :until"
        " WHERE leaderships.held_by IS NULL OR leaderships.held_by = :node"
        " OR leaderships.lease_until < :now",
        {"name": name, "node": node, "now": timestamp(now), "until": timestamp(until)},
    )
    holder = tx.value("SELECT held_by FROM leaderships WHERE name = :name", {"name": name})
    return bool(holder == node)
