"""Work tables claimed with row leases: webhook deliveries and forward jobs.

A row is due when its status is `pending` or `retrying`, its due column has passed and no
live lease holds it. Claiming sets `lease_until` and `leased_by`; on PostgreSQL the rows are
locked with `FOR UPDATE SKIP LOCKED`, so nodes sharing a database never claim the same row.
A node that restarts gives back its own leases at once; a dead node's lapse on their own.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import parse_optional_timestamp, timestamp
from storage.tx import Row, Tx


def _unleased_work(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return (
        f"{a}status IN ('pending', 'retrying')"
        f" AND ({a}lease_until IS NULL OR {a}lease_until < :now)"
    )


@dataclass(frozen=True, slots=True)
class LeasedTable:
    name: str
    due_column: str

    def release(self, tx: Tx, node: str) -> int:
        """Give back every lease `node` holds (it restarted); how many there were."""
        return tx.execute(
            f"UPDATE {self.name} SET lease_until = NULL, leased_by = NULL WHERE leased_by = :node",
            {"node": node},
        )

    def claim_due(
        self,
        tx: Tx,
        now: datetime,
        lease_until: datetime,
        node: str,
        limit: int,
        *,
        join: str = "",
        also: str = "",
    ) -> tuple[list[Row], datetime | None]:
        """Lease up to `limit` due rows (alias `q`; `join`/`also` add joined columns); and when
        the next unleased row falls due."""
        lock = " FOR UPDATE OF q SKIP LOCKED" if tx.dialect == "postgresql" else ""
        due = self.due_column
        rows = tx.all(
            f"SELECT q.*{also} FROM {self.name} q{join}"
            f" WHERE {_unleased_work('q')} AND q.{due} <= :now"
            f" ORDER BY q.{due}, q.id LIMIT :limit{lock}",
            {"now": timestamp(now), "limit": limit},
        )
        tx.execute_many(
            f"UPDATE {self.name} SET lease_until = :lease, leased_by = :node WHERE id = :id",
            ({"lease": timestamp(lease_until), "node": node, "id": row["id"]} for row in rows),
        )
        following = tx.value(
            f"SELECT MIN({due}) FROM {self.name} WHERE {_unleased_work()}", {"now": timestamp(now)}
        )
        return rows, parse_optional_timestamp(following)
