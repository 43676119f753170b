"""Destination policies, warm-up ramps and the budget counters behind them (migration 0020).

Policies and ramps are per workspace, every read scoped by it. Budgets are shared by every
node: a claim locks the rows it advances (`FOR UPDATE` on PostgreSQL, in key order, so two
nodes never wait on each other in a cycle; SQLite has one writer), so no two nodes can spend
the same message of a budget.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from storage.codec import in_list, parse_timestamp, timestamp
from storage.tx import Row, Tx


@dataclass(frozen=True, slots=True)
class Rule:
    """A destination policy; `workspace_id` None for the built-in ones."""

    id: str
    workspace_id: str | None
    domain_id: str | None  # the sending domain; None: every one of the workspace
    match: str  # `example.com` (recipient domain) or `*.example.com` (MX host suffix)
    max_connections: int | None
    messages_per_connection: int | None
    per_minute: int | None
    per_hour: int | None
    per_day: int | None
    name: str | None = None  # built-in rules only
    created_at: datetime | None = None
    updated_at: datetime | None = None

    @property
    def builtin(self) -> bool:
        return self.workspace_id is None

    @property
    def suffix(self) -> str | None:
        """The MX host suffix a `*.` rule matches, else None."""
        return self.match[2:] if self.match.startswith("*.") else None


@dataclass(frozen=True, slots=True)
class Ramp:
    id: str
    workspace_id: str
    domain_id: str
    first_day: int
    factor: float
    target_per_day: int
    starts_on: date
    created_at: datetime
    updated_at: datetime


LIMIT_FIELDS = ("max_connections", "messages_per_connection", "per_minute", "per_hour", "per_day")


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _rule(row: Row) -> Rule:
    return Rule(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        match=row["match"],
        max_connections=_optional_int(row["max_connections"]),
        messages_per_connection=_optional_int(row["messages_per_connection"]),
        per_minute=_optional_int(row["per_minute"]),
        per_hour=_optional_int(row["per_hour"]),
        per_day=_optional_int(row["per_day"]),
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


def _ramp(row: Row) -> Ramp:
    return Ramp(
        id=row["id"],
        workspace_id=row["workspace_id"],
        domain_id=row["domain_id"],
        first_day=int(row["first_day"]),
        factor=float(row["factor"]),
        target_per_day=int(row["target_per_day"]),
        starts_on=date.fromisoformat(row["starts_on"]),
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


# -- policies ----------------------------------------------------------------------------


def list_rules(tx: Tx, workspace_id: str) -> list[Rule]:
    rows = tx.all(
        "SELECT * FROM delivery_policies WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_rule(row) for row in rows]


def get_rule(tx: Tx, workspace_id: str, rule_id: str) -> Rule | None:
    row = tx.one(
        "SELECT * FROM delivery_policies WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": rule_id},
    )
    return None if row is None else _rule(row)


def rule_exists(tx: Tx, workspace_id: str, domain_id: str | None, match: str, but: str) -> bool:
    """Whether another rule (not `but`) has this scope and match."""
    return (
        tx.one(
            "SELECT id FROM delivery_policies WHERE workspace_id = :ws"
            " AND COALESCE(domain_id, '') = :d AND match = :m AND id <> :but",
            {"ws": workspace_id, "d": domain_id or "", "m": match, "but": but},
        )
        is not None
    )


def save_rule(tx: Tx, rule: Rule) -> None:
    """Insert a rule, or replace the one with its id."""
    assert rule.workspace_id is not None and rule.created_at and rule.updated_at
    params = {name: getattr(rule, name) for name in LIMIT_FIELDS} | {
        "id": rule.id,
        "ws": rule.workspace_id,
        "d": rule.domain_id,
        "m": rule.match,
        "created": timestamp(rule.created_at),
        "updated": timestamp(rule.updated_at),
    }
    tx.execute("DELETE FROM delivery_policies WHERE id = :id", {"id": rule.id})
    tx.execute(
        "INSERT INTO delivery_policies (id, workspace_id, domain_id, match, max_connections,"
        " messages_per_connection, per_minute, per_hour, per_day, created_at, updated_at)"
        " VALUES (:id, :ws, :d, :m, :max_connections, :messages_per_connection, :per_minute,"
        " :per_hour, :per_day, :created, :updated)",
        params,
    )


def delete_rule(tx: Tx, workspace_id: str, rule_id: str) -> bool:
    return bool(
        tx.execute(
            "DELETE FROM delivery_policies WHERE workspace_id = :ws AND id = :id",
            {"ws": workspace_id, "id": rule_id},
        )
    )


def rules_of(tx: Tx, workspace_ids: Iterable[str]) -> dict[str, list[Rule]]:
    """The rules of each workspace (for a delivery round)."""
    ids = sorted(set(workspace_ids))
    found: dict[str, list[Rule]] = {ws: [] for ws in ids}
    if not ids:
        return found
    names, params = in_list("w", ids)
    for row in tx.all(f"SELECT * FROM delivery_policies WHERE workspace_id IN ({names})", params):
        found[row["workspace_id"]].append(_rule(row))
    return found


def suffix_patterns(tx: Tx) -> list[str]:
    """Every MX suffix any workspace's rule names (they group domains for connections)."""
    rows = tx.all("SELECT DISTINCT match FROM delivery_policies WHERE match LIKE '*.%'")
    return [row["match"] for row in rows]


# -- ramps -------------------------------------------------------------------------------


def list_ramps(tx: Tx, workspace_id: str) -> list[Ramp]:
    rows = tx.all(
        "SELECT * FROM delivery_ramps WHERE workspace_id = :ws ORDER BY created_at, id",
        {"ws": workspace_id},
    )
    return [_ramp(row) for row in rows]


def get_ramp(tx: Tx, workspace_id: str, ramp_id: str) -> Ramp | None:
    row = tx.one(
        "SELECT * FROM delivery_ramps WHERE workspace_id = :ws AND id = :id",
        {"ws": workspace_id, "id": ramp_id},
    )
    return None if row is None else _ramp(row)


def ramp_for_domain(tx: Tx, workspace_id: str, domain_id: str) -> Ramp | None:
    row = tx.one(
        "SELECT * FROM delivery_ramps WHERE workspace_id = :ws AND domain_id = :d",
        {"ws": workspace_id, "d": domain_id},
    )
    return None if row is None else _ramp(row)


def save_ramp(tx: Tx, ramp: Ramp) -> None:
    """Insert a ramp, or replace the one with its id."""
    tx.execute("DELETE FROM delivery_ramps WHERE id = :id", {"id": ramp.id})
    tx.execute(
        "INSERT INTO delivery_ramps (id, workspace_id, domain_id, first_day, factor,"
        " target_per_day, starts_on, created_at, updated_at) VALUES (:id, :ws, :d, :first,"
        " :factor, :target, :starts, :created, :updated)",
        {
            "id": ramp.id,
            "ws": ramp.workspace_id,
            "d": ramp.domain_id,
            "first": ramp.first_day,
            "factor": ramp.factor,
            "target": ramp.target_per_day,
            "starts": ramp.starts_on.isoformat(),
            "created": timestamp(ramp.created_at),
            "updated": timestamp(ramp.updated_at),
        },
    )


def delete_ramp(tx: Tx, workspace_id: str, ramp_id: str) -> bool:
    return bool(
        tx.execute(
            "DELETE FROM delivery_ramps WHERE workspace_id = :ws AND id = :id",
            {"ws": workspace_id, "id": ramp_id},
        )
    )


def ramps_of(tx: Tx, workspace_ids: Iterable[str]) -> dict[tuple[str, str], Ramp]:
    """The ramps of these workspaces, by (workspace, sending domain)."""
    ids = sorted(set(workspace_ids))
    if not ids:
        return {}
    names, params = in_list("w", ids)
    rows = tx.all(f"SELECT * FROM delivery_ramps WHERE workspace_id IN ({names})", params)
    return {(r.workspace_id, r.domain_id): r for r in map(_ramp, rows)}


# -- budgets -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Budget:
    """A budget row: the window it counts, messages used in it, and for a paced rate the
    theoretical arrival time of its next message (GCRA; None: not paced yet)."""

    window_start: datetime
    used: int
    tat: datetime | None = None


def lock_budgets(tx: Tx, windows: dict[str, datetime]) -> dict[str, Budget]:
    """The budget rows of these keys, locked until the unit ends; a key without a row gets
    one for its current window (`windows`), so that nodes spending a new budget at once
    queue on its row instead of each writing its own count."""
    if not windows:
        return {}
    ordered = sorted(windows)
    tx.execute_many(
        "INSERT INTO delivery_budgets (budget_key, window_start, used) VALUES (:k, :w, 0)"
        " ON CONFLICT (budget_key) DO NOTHING",
        ({"k": key, "w": timestamp(windows[key])} for key in ordered),
    )
    names, params = in_list("k", ordered)
    lock = tx.row_lock("ORDER BY budget_key FOR UPDATE")
    rows = tx.all(
        f"SELECT budget_key, window_start, used, tat FROM delivery_budgets"
        f" WHERE budget_key IN ({names}){lock}",
        params,
    )
    return {
        row["budget_key"]: Budget(
            parse_timestamp(row["window_start"]),
            int(row["used"]),
            None if row["tat"] is None else parse_timestamp(row["tat"]),
        )
        for row in rows
    }


def save_budgets(tx: Tx, spent: dict[str, Budget]) -> None:
    """Write each key's budget row (in key order)."""
    tx.execute_many(
        "INSERT INTO delivery_budgets (budget_key, window_start, used, tat) VALUES (:k, :w, :u, :t)"
        " ON CONFLICT (budget_key) DO UPDATE SET window_start = :w, used = :u, tat = :t",
        (
            {
                "k": key,
                "w": timestamp(b.window_start),
                "u": b.used,
                "t": None if b.tat is None else timestamp(b.tat),
            }
            for key, b in sorted(spent.items())
        ),
    )


# Budget rows of windows over a day old removed per round that spends a budget: enough to
# keep up with new keys (an operator cap counts per destination), few enough to cost nothing.
PRUNE_BATCH = 100


def prune_budgets(tx: Tx, before: datetime) -> None:
    """Remove up to PRUNE_BATCH budget rows whose window started before `before`."""
    # Rows another node is spending are skipped, not waited for.
    lock = tx.row_lock("FOR UPDATE SKIP LOCKED")
    tx.execute(
        "DELETE FROM delivery_budgets WHERE budget_key IN (SELECT budget_key FROM"
        f" delivery_budgets WHERE window_start < :before ORDER BY window_start"
        f" LIMIT {PRUNE_BATCH}{lock})",
        {"before": timestamp(before)},
    )


def read_budgets(tx: Tx, keys: Sequence[str]) -> dict[str, tuple[datetime, int]]:
    """The budget rows of `keys`, unlocked (for the forecast)."""
    if not keys:
        return {}
    names, params = in_list("k", sorted(set(keys)))
    rows = tx.all(
        f"SELECT budget_key, window_start, used FROM delivery_budgets WHERE budget_key IN ({names})",
        params,
    )
    return {
        row["budget_key"]: (parse_timestamp(row["window_start"]), int(row["used"])) for row in rows
    }


# -- the delivery round ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Sending:
    """What the claim needs of an email: whose it is, from which domain, for events."""

    workspace_id: str
    domain_id: str
    subject: str
    tags: str  # JSON, as stored


def sending_of(tx: Tx, email_ids: Sequence[str]) -> dict[str, Sending]:
    ids = list(dict.fromkeys(email_ids))
    if not ids:
        return {}
    names, params = in_list("e", ids)
    rows = tx.all(
        f"SELECT id, workspace_id, domain_id, subject, tags FROM emails WHERE id IN ({names})",
        params,
    )
    return {
        row["id"]: Sending(row["workspace_id"], row["domain_id"], row["subject"], row["tags"])
        for row in rows
    }


def slots_taken(tx: Tx, destination: str, limit: int, now: datetime) -> int:
    """How many of the destination's first `limit` connection slots are held now."""
    return int(
        tx.value(
            "SELECT COUNT(*) FROM destination_slots WHERE destination = :d AND slot < :limit"
            " AND held_by IS NOT NULL AND lease_until >= :now",
            {"d": destination, "limit": limit, "now": timestamp(now)},
        )
    )


def emails_in_flight(
    tx: Tx, domain: str, workspace_id: str, domain_id: str | None, now: datetime
) -> set[str]:
    """Emails of a workspace (from one sending domain, when given) whose recipients at
    `domain` a delivery round holds now, on any node: each has at most one connection."""
    params = {"domain": domain, "ws": workspace_id, "now": timestamp(now)}
    where = ""
    if domain_id is not None:
        where, params["d"] = " AND e.domain_id = :d", domain_id
    rows = tx.all(
        "SELECT DISTINCT r.email_id FROM email_recipients r JOIN emails e ON e.id = r.email_id"
        " WHERE r.status IN ('queued', 'deferred') AND r.domain = :domain"
        f" AND r.lease_until >= :now AND e.workspace_id = :ws{where}",
        params,
    )
    return {str(row["email_id"]) for row in rows}


def unlease(tx: Tx, keys: Sequence[tuple[str, str]], holder: str | None = None) -> None:
    """Give claimed recipients back untouched (the round could not get a connection); with
    `holder`, only those that node still holds."""
    fence = "" if holder is None else " AND leased_by = :holder"
    tx.execute_many(
        "UPDATE email_recipients SET lease_until = NULL, leased_by = NULL"
        f" WHERE email_id = :e AND address = :a{fence}",
        ({"e": e, "a": a} | ({} if holder is None else {"holder": holder}) for e, a in keys),
    )


def throttle(tx: Tx, waits: Sequence[tuple[str, str, str, datetime, str]], now: datetime) -> None:
    """Set recipients (email id, address, new status, when, response) waiting for budget: not an
    attempt, so `attempts` stays; their 72-hour window restarts when they are let go."""
    tx.execute_many(
        "UPDATE email_recipients SET status = :s, next_attempt_at = :t, expiry_from = :t,"
        " last_response = :r, lease_until = NULL, leased_by = NULL, updated_at = :now"
        " WHERE email_id = :e AND address = :a",
        (
            {"s": s, "t": timestamp(t), "r": r, "now": timestamp(now), "e": e, "a": a}
            for e, a, s, t, r in waits
        ),
    )


# -- the forecast ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Backlog:
    recipient_domain: str
    domain_id: str
    waiting: int
    # The latest next attempt among them: a deferred recipient leaves no earlier.
    next_attempt_at: datetime | None = None


def backlog(
    tx: Tx, workspace_id: str, within: tuple[str, datetime, datetime] | None = None
) -> list[Backlog]:
    """Recipients still to deliver (scheduled emails aside), per recipient domain and sending
    domain; `within`:
    only the broadcast emails of one sending domain created in [start, end]."""
    extra, params = "", {"ws": workspace_id}
    if within is not None:
        extra = (
            " AND e.source = 'broadcast' AND e.domain_id = :d"
            " AND e.created_at >= :start AND e.created_at <= :end"
        )
        params |= {"d": within[0], "start": timestamp(within[1]), "end": timestamp(within[2])}
    rows = tx.all(
        "SELECT r.domain AS domain, e.domain_id AS domain_id, COUNT(*) AS n,"
        " MAX(r.next_attempt_at) AS next_at"
        " FROM email_recipients r JOIN emails e ON e.id = r.email_id"
        " WHERE e.workspace_id = :ws AND r.status IN ('queued', 'deferred')"
        # Scheduled mail is not waiting yet: it leaves at its time.
        " AND e.status <> 'scheduled'" + extra + " GROUP BY r.domain, e.domain_id ORDER BY n DESC",
        params,
    )
    return [
        Backlog(
            row["domain"],
            row["domain_id"],
            int(row["n"]),
            None if row["next_at"] is None else parse_timestamp(row["next_at"]),
        )
        for row in rows
    ]


def recent_outcomes(tx: Tx, workspace_id: str, since: datetime) -> dict[str, tuple[int, int]]:
    """Per recipient domain: recipients delivered, and recipients tried and not (yet)
    accepted (deferred by a reply, bounced, failed), updated since `since`."""
    rows = tx.all(
        "SELECT r.domain AS domain,"
        " SUM(CASE WHEN r.status = 'delivered' THEN 1 ELSE 0 END) AS ok,"
        " SUM(CASE WHEN r.status <> 'delivered' THEN 1 ELSE 0 END) AS other"
        " FROM email_recipients r JOIN emails e ON e.id = r.email_id"
        " WHERE e.workspace_id = :ws AND r.updated_at >= :since AND r.attempts > 0"
        " AND r.status IN ('delivered', 'deferred', 'bounced', 'failed')"
        " AND (r.last_response IS NULL OR r.last_response NOT LIKE 'throttled%')"
        " GROUP BY r.domain",
        {"ws": workspace_id, "since": timestamp(since)},
    )
    return {row["domain"]: (int(row["ok"] or 0), int(row["other"] or 0)) for row in rows}
