"""Work tables claimed with row leases: webhook deliveries and forward jobs.

A row is due when its status is `pending` or `retrying`, its due column has passed and no
live lease holds it. Claiming sets `lease_until` and `leased_by`; on PostgreSQL the rows are
locked with `FOR UPDATE SKIP LOCKED`, so nodes sharing a database never claim the same row.
The holder's heartbeat renews the lease; a dead node's are freed when it is reaped
(storage/nodes.py).

Faults: a row that made its actor raise (it could not even be read, or working it raised)
counts a fault; it is due again at the retry time given, and the one that reaches the
engine's limit is quarantined — its table's final status, the error where its log shows it —
so it is never claimed again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Generic, TypeVar

from storage.codec import parse_optional_timestamp, timestamp
from storage.tx import Row, Tx

T = TypeVar("T")


def _unleased_work(alias: str = "") -> str:
    a = f"{alias}." if alias else ""
    return (
        f"{a}status IN ('pending', 'retrying')"
        f" AND ({a}lease_until IS NULL OR {a}lease_until < :now)"
    )


@dataclass(frozen=True, slots=True)
class Fault:
    """A row that made its actor raise, and why."""

    id: str
    error: str


@dataclass(frozen=True, slots=True)
class FaultPolicy:
    """The engine's rule for rows that make an actor raise (engine/platform/faults.py): when a faulted
    row is tried again, and after how many faults it is quarantined."""

    retry_at: datetime
    quarantine_after: int


@dataclass(frozen=True, slots=True)
class Claimed(Generic[T]):
    """What one claim leased, when the next unleased row falls due, and the rows that could
    not be read (each counted a fault; `quarantined` of them reached the limit)."""

    items: list[T]
    next_due: datetime | None
    faults: list[Fault]
    quarantined: int


@dataclass(frozen=True, slots=True)
class LeasedTable:
    name: str
    due_column: str
    quarantine_status: str  # the final status a quarantined row takes
    error_column: str  # where a row's log shows its error

    def claim_due(
        self,
        tx: Tx,
        now: datetime,
        lease_until: datetime,
        node: str,
        limit: int,
        decode: Callable[[Row], T],
        faults: FaultPolicy,
        *,
        join: str = "",
        also: str = "",
    ) -> Claimed[T]:
        """Lease up to `limit` due rows (alias `q`; `join`/`also` add joined columns), each
        decoded. A row that cannot be decoded is not leased: it counts a fault instead."""
        lock = tx.row_lock("FOR UPDATE OF q SKIP LOCKED")
        due = self.due_column
        rows = tx.all(
            f"SELECT q.*{also} FROM {self.name} q{join}"
            f" WHERE {_unleased_work('q')} AND q.{due} <= :now"
            f" ORDER BY q.{due}, q.id LIMIT :limit{lock}",
            {"now": timestamp(now), "limit": limit},
        )
        items: list[T] = []
        leased: list[str] = []
        broken: list[Fault] = []
        for row in rows:
            try:
                items.append(decode(row))
                leased.append(row["id"])
            except Exception as exc:  # a row no code can read: every claim would fail on it
                broken.append(Fault(row["id"], f"the stored row cannot be read: {exc!r}"))
        tx.execute_many(
            f"UPDATE {self.name} SET lease_until = :lease, leased_by = :node WHERE id = :id",
            ({"lease": timestamp(lease_until), "node": node, "id": id_} for id_ in leased),
        )
        quarantined = self.record_faults(tx, broken, now, faults)
        following = tx.value(
            f"SELECT MIN({due}) FROM {self.name} WHERE {_unleased_work()}", {"now": timestamp(now)}
        )
        return Claimed(items, parse_optional_timestamp(following), broken, quarantined)

    def held(self, tx: Tx, id_: str, node: str) -> bool:
        """Whether `node` still holds the row's lease, the row locked until commit on
        PostgreSQL: a node declared dead while it worked the row (its leases freed, the row
        perhaps claimed and worked by another node) must write nothing of it."""
        lock = tx.row_lock()
        found = tx.value(
            f"SELECT 1 FROM {self.name} WHERE id = :id AND leased_by = :node{lock}",
            {"id": id_, "node": node},
        )
        return found is not None

    def record_faults(
        self,
        tx: Tx,
        faults: Sequence[Fault],
        now: datetime,
        policy: FaultPolicy,
        holder: str | None = None,
    ) -> int:
        """Count a fault on each row and release it to be tried again at `policy.retry_at`;
        quarantine those that reached `policy.quarantine_after`. How many were quarantined.
        With `holder`, only rows that node still leases: a node declared dead while its work
        raised must not count a fault on (or quarantine) a row another node works now."""
        if not faults:
            return 0
        held = " AND leased_by = :holder" if holder is not None else ""
        counted = [
            f
            for f in faults
            if tx.execute(
                f"UPDATE {self.name} SET faults = faults + 1, last_fault = :error,"
                f" lease_until = NULL, leased_by = NULL, {self.due_column} = :retry,"
                f" updated_at = :now WHERE id = :id{held}",
                {
                    "error": f.error,
                    "retry": timestamp(policy.retry_at),
                    "now": timestamp(now),
                    "id": f.id,
                    "holder": holder,
                },
            )
        ]
        quarantined = 0
        for f in counted:
            quarantined += tx.execute(
                f"UPDATE {self.name} SET status = :final, {self.due_column} = NULL,"
                f" {self.error_column} = :note WHERE id = :id AND faults >= :limit"
                " AND status IN ('pending', 'retrying')",
                {
                    "final": self.quarantine_status,
                    "note": f"quarantined after {policy.quarantine_after} faults: {f.error}",
                    "id": f.id,
                    "limit": policy.quarantine_after,
                },
            )
        return quarantined
