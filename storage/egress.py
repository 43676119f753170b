"""Egress sources, pools and the pool assigned to a workspace or sending domain (migration
0051). Operator resources: not scoped by workspace; the admin actions are in
engine/delivery/egress_admin.py, the choice of a source for an email in
engine/delivery/egress_sources.py."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime

from storage.codec import in_list, parse_timestamp, timestamp
from storage.tx import Row, Tx

WORKSPACE, DOMAIN = "workspace", "domain"  # what a pool is assigned to


@dataclass(frozen=True, slots=True)
class Source:
    id: str
    name: str
    bind_address: str
    ehlo_name: str
    created_at: datetime
    updated_at: datetime


@dataclass(frozen=True, slots=True)
class Member:
    source_id: str
    weight: int


@dataclass(frozen=True, slots=True)
class Pool:
    id: str
    name: str
    sources: tuple[Member, ...]
    created_at: datetime
    updated_at: datetime


def _source(row: Row) -> Source:
    return Source(
        id=row["id"],
        name=row["name"],
        bind_address=row["bind_address"],
        ehlo_name=row["ehlo_name"],
        created_at=parse_timestamp(row["created_at"]),
        updated_at=parse_timestamp(row["updated_at"]),
    )


# -- sources -----------------------------------------------------------------------------


def list_sources(tx: Tx) -> list[Source]:
    return [_source(r) for r in tx.all("SELECT * FROM egress_sources ORDER BY created_at, id")]


def get_source(tx: Tx, source_id: str, *, lock: bool = False) -> Source | None:
    """The source; with `lock`, held until commit, so two changes at once (from two nodes, or
    two write transactions of one) are made one after the other and neither is lost."""
    row = tx.one(
        "SELECT * FROM egress_sources WHERE id = :id" + tx.row_lock(when=lock), {"id": source_id}
    )
    return None if row is None else _source(row)


def sources_of(tx: Tx, source_ids: Iterable[str]) -> dict[str, Source]:
    ids = sorted(set(source_ids))
    if not ids:
        return {}
    names, params = in_list("s", ids)
    rows = tx.all(f"SELECT * FROM egress_sources WHERE id IN ({names})", params)
    return {row["id"]: _source(row) for row in rows}


def source_named(tx: Tx, name: str, but: str) -> bool:
    """Whether a source other than `but` has this name."""
    row = tx.one(
        "SELECT id FROM egress_sources WHERE name = :n AND id <> :but", {"n": name, "but": but}
    )
    return row is not None


def _source_params(source: Source) -> dict[str, str]:
    return {
        "id": source.id,
        "n": source.name,
        "a": source.bind_address,
        "e": source.ehlo_name,
        "c": timestamp(source.created_at),
        "u": timestamp(source.updated_at),
    }


def insert_source(tx: Tx, source: Source) -> None:
    tx.execute(
        "INSERT INTO egress_sources (id, name, bind_address, ehlo_name, created_at,"
        " updated_at) VALUES (:id, :n, :a, :e, :c, :u)",
        _source_params(source),
    )


def update_source(tx: Tx, source: Source) -> bool:
    """Update the source with its id; False when there is none (deleted meanwhile: an
    update never re-creates it)."""
    updated = tx.execute(
        "UPDATE egress_sources SET name = :n, bind_address = :a, ehlo_name = :e,"
        " updated_at = :u WHERE id = :id",
        _source_params(source),
    )
    return bool(updated)


def pools_using(tx: Tx, source_id: str) -> list[str]:
    """The names of the pools that draw on a source."""
    rows = tx.all(
        "SELECT p.name FROM egress_pool_sources m JOIN egress_pools p ON p.id = m.pool_id"
        " WHERE m.source_id = :s ORDER BY p.name",
        {"s": source_id},
    )
    return [row["name"] for row in rows]


def delete_source(tx: Tx, source_id: str) -> bool:
    return bool(tx.execute("DELETE FROM egress_sources WHERE id = :id", {"id": source_id}))


# -- pools -------------------------------------------------------------------------------


def _pools(tx: Tx, rows: Sequence[Row]) -> list[Pool]:
    ids = [row["id"] for row in rows]
    members: dict[str, list[Member]] = {i: [] for i in ids}
    if ids:
        names, params = in_list("p", ids)
        for m in tx.all(
            f"SELECT * FROM egress_pool_sources WHERE pool_id IN ({names})"
            " ORDER BY pool_id, source_id",
            params,
        ):
            members[m["pool_id"]].append(Member(m["source_id"], int(m["weight"])))
    return [
        Pool(
            id=row["id"],
            name=row["name"],
            sources=tuple(members[row["id"]]),
            created_at=parse_timestamp(row["created_at"]),
            updated_at=parse_timestamp(row["updated_at"]),
        )
        for row in rows
    ]


def list_pools(tx: Tx) -> list[Pool]:
    return _pools(tx, tx.all("SELECT * FROM egress_pools ORDER BY created_at, id"))


def get_pool(tx: Tx, pool_id: str, *, lock: bool = False) -> Pool | None:
    """The pool; with `lock`, held until commit (as `get_source`)."""
    sql = "SELECT * FROM egress_pools WHERE id = :id" + tx.row_lock(when=lock)
    found = _pools(tx, tx.all(sql, {"id": pool_id}))
    return found[0] if found else None


def pools_of(tx: Tx, pool_ids: Iterable[str]) -> dict[str, Pool]:
    ids = sorted(set(pool_ids))
    if not ids:
        return {}
    names, params = in_list("p", ids)
    rows = tx.all(f"SELECT * FROM egress_pools WHERE id IN ({names})", params)
    return {pool.id: pool for pool in _pools(tx, rows)}


def pool_named(tx: Tx, name: str, but: str) -> bool:
    row = tx.one(
        "SELECT id FROM egress_pools WHERE name = :n AND id <> :but", {"n": name, "but": but}
    )
    return row is not None


def save_pool(tx: Tx, pool: Pool, *, new: bool) -> bool:
    """Insert a pool (`new`), or update the one with its id, with exactly its sources;
    False when there is none to update (deleted meanwhile: an update never re-creates it)."""
    params = {
        "id": pool.id,
        "n": pool.name,
        "c": timestamp(pool.created_at),
        "u": timestamp(pool.updated_at),
    }
    if new:
        tx.execute(
            "INSERT INTO egress_pools (id, name, created_at, updated_at) VALUES (:id, :n, :c, :u)",
            params,
        )
    elif not tx.execute(
        "UPDATE egress_pools SET name = :n, updated_at = :u WHERE id = :id", params
    ):
        return False
    tx.execute("DELETE FROM egress_pool_sources WHERE pool_id = :id", {"id": pool.id})
    tx.execute_many(
        "INSERT INTO egress_pool_sources (pool_id, source_id, weight) VALUES (:p, :s, :w)",
        [{"p": pool.id, "s": m.source_id, "w": m.weight} for m in pool.sources],
    )
    return True


def assigned_to(tx: Tx, pool_id: str) -> int:
    """How many workspaces and sending domains are assigned the pool."""
    row = tx.one("SELECT COUNT(*) AS n FROM egress_assignments WHERE pool_id = :p", {"p": pool_id})
    return 0 if row is None else int(row["n"])


def delete_pool(tx: Tx, pool_id: str) -> bool:
    return bool(tx.execute("DELETE FROM egress_pools WHERE id = :id", {"id": pool_id}))


# -- assignments -------------------------------------------------------------------------


def assigned(tx: Tx, kind: str, target_id: str) -> str | None:
    """The pool assigned to a workspace or a sending domain, if any."""
    row = tx.one(
        "SELECT pool_id FROM egress_assignments WHERE kind = :k AND target_id = :t",
        {"k": kind, "t": target_id},
    )
    return None if row is None else str(row["pool_id"])


def assign(tx: Tx, kind: str, target_id: str, pool_id: str | None) -> None:
    """Assign a pool (None: none, the default egress)."""
    tx.execute(
        "DELETE FROM egress_assignments WHERE kind = :k AND target_id = :t",
        {"k": kind, "t": target_id},
    )
    if pool_id is not None:
        tx.execute(
            "INSERT INTO egress_assignments (kind, target_id, pool_id) VALUES (:k, :t, :p)",
            {"k": kind, "t": target_id, "p": pool_id},
        )


def assignments_of(
    tx: Tx, workspace_ids: Iterable[str], domain_ids: Iterable[str]
) -> dict[tuple[str, str], str]:
    """The pools assigned to these workspaces and domains, by (kind, id)."""
    found: dict[tuple[str, str], str] = {}
    for kind, ids in ((WORKSPACE, sorted(set(workspace_ids))), (DOMAIN, sorted(set(domain_ids)))):
        if not ids:
            continue
        names, params = in_list("t", ids)
        rows = tx.all(
            f"SELECT target_id, pool_id FROM egress_assignments WHERE kind = :k"
            f" AND target_id IN ({names})",
            {"k": kind, **params},
        )
        found.update({(kind, row["target_id"]): row["pool_id"] for row in rows})
    return found


def target_exists(tx: Tx, kind: str, target_id: str) -> bool:
    """Whether the workspace or sending domain a pool would be assigned to exists."""
    table = "workspaces" if kind == WORKSPACE else "domains"
    return tx.one(f"SELECT id FROM {table} WHERE id = :id", {"id": target_id}) is not None
