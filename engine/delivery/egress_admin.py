"""The operator's egress sources and pools, and the pool of a workspace or sending domain
(`/v1/admin/egress/...`, platform administrators only): checks and changes; how mail uses
them is engine/delivery/egress_sources.py."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, replace
from datetime import datetime
from typing import TypeVar

from engine.accounts.users import require_admin
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.smtp.grammar import check_helo_name
from storage import egress
from storage.codec import new_id
from storage.egress import Member, Pool, Source
from storage.tx import Tx

T = TypeVar("T")


def _existing(found: T | None, what: str) -> T:
    """`found`, or 404 for the `what` (source, pool) that is not there."""
    if found is None:
        raise NotFound(f"no such egress {what}")
    return found


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def checked_address(value: str) -> str:
    """An IPv4 or IPv6 address to bind, in its canonical form; 422 otherwise."""
    try:
        address = ipaddress.ip_address(value.strip())
    except ValueError:
        raise _invalid("bind_address", "bind_address must be an IPv4 or IPv6 address") from None
    if address.is_multicast or address.is_unspecified:
        raise _invalid("bind_address", "bind_address must be a unicast address of this host")
    return str(address)


def checked_ehlo(value: str) -> str:
    name = value.strip().lower().rstrip(".")
    try:
        check_helo_name(name)
    except ValueError as exc:
        raise _invalid("ehlo_name", str(exc)) from None
    if "." not in name:
        raise _invalid("ehlo_name", "ehlo_name must be a fully qualified host name")
    return name


# -- sources -----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SourceChange:
    """The fields a request sets (None: unchanged)."""

    name: str | None = None
    bind_address: str | None = None
    ehlo_name: str | None = None


def _checked_source(change: SourceChange) -> SourceChange:
    """The change with its address and EHLO name checked and made canonical; 422 else."""
    return SourceChange(
        change.name,
        None if change.bind_address is None else checked_address(change.bind_address),
        None if change.ehlo_name is None else checked_ehlo(change.ehlo_name),
    )


def _save_source(tx: Tx, source_id: str | None, change: SourceChange, now: datetime) -> Source:
    """Create a source (`source_id` None) or change one, read and written in one unit of
    work: two changes at once never lose one, and one racing a delete gets a 404."""
    if source_id is None:
        assert change.name and change.bind_address and change.ehlo_name
        found = Source(new_id(), change.name, change.bind_address, change.ehlo_name, now, now)
    else:
        found = _existing(egress.get_source(tx, source_id, lock=True), "source")
    source = replace(
        found,
        name=change.name or found.name,
        bind_address=change.bind_address or found.bind_address,
        ehlo_name=change.ehlo_name or found.ehlo_name,
        updated_at=now,
    )
    if egress.source_named(tx, source.name, source.id):
        raise Conflict(f"an egress source named {source.name} exists", code="source_exists")
    if source_id is None:
        egress.insert_source(tx, source)
    elif not egress.update_source(tx, source):
        raise NotFound("no such egress source")
    return source


async def create_source(rt: Runtime, who: Principal, change: SourceChange) -> Source:
    await require_admin(rt, who)
    return await rt.db.write(_save_source, None, _checked_source(change), rt.clock.now())


async def list_sources(rt: Runtime, who: Principal) -> list[Source]:
    await require_admin(rt, who)
    return await rt.db.read(egress.list_sources)


async def get_source(rt: Runtime, who: Principal, source_id: str) -> Source:
    await require_admin(rt, who)
    return _existing(await rt.db.read(egress.get_source, source_id), "source")


async def update_source(
    rt: Runtime, who: Principal, source_id: str, change: SourceChange
) -> Source:
    await require_admin(rt, who)
    return await rt.db.write(_save_source, source_id, _checked_source(change), rt.clock.now())


def _delete_source(tx: Tx, source_id: str) -> None:
    using = egress.pools_using(tx, source_id)
    if using:
        raise Conflict(
            f"the egress source is in pools {', '.join(using)}: take it out of them first",
            code="source_in_use",
            pools=using,
        )
    if not egress.delete_source(tx, source_id):
        raise NotFound("no such egress source")


async def delete_source(rt: Runtime, who: Principal, source_id: str) -> None:
    await require_admin(rt, who)
    await rt.db.write(_delete_source, source_id)


# -- pools -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PoolChange:
    name: str | None = None
    sources: tuple[Member, ...] | None = None


def _checked_members(members: tuple[Member, ...]) -> tuple[Member, ...]:
    ids = [m.source_id for m in members]
    if len(set(ids)) != len(ids):
        raise _invalid("sources", "a source may be in a pool once")
    return members


def _save_pool(tx: Tx, pool_id: str | None, change: PoolChange, now: datetime) -> Pool:
    """Create a pool (`pool_id` None) or change one, in one unit of work, as `_save_source`."""
    if pool_id is None:
        assert change.name and change.sources is not None
        found = Pool(new_id(), change.name, change.sources, now, now)
    else:
        found = _existing(egress.get_pool(tx, pool_id, lock=True), "pool")
    pool = replace(
        found,
        name=change.name or found.name,
        sources=found.sources if change.sources is None else change.sources,
        updated_at=now,
    )
    if egress.pool_named(tx, pool.name, pool.id):
        raise Conflict(f"an egress pool named {pool.name} exists", code="pool_exists")
    known = egress.sources_of(tx, (m.source_id for m in pool.sources))
    missing = [m.source_id for m in pool.sources if m.source_id not in known]
    if missing:
        raise NotFound(f"no such egress source: {', '.join(missing)}")
    if not egress.save_pool(tx, pool, new=pool_id is None):
        raise NotFound("no such egress pool")
    return pool


def _checked_pool(change: PoolChange) -> PoolChange:
    if change.sources is None:
        return change
    return PoolChange(change.name, _checked_members(change.sources))


async def create_pool(rt: Runtime, who: Principal, change: PoolChange) -> Pool:
    await require_admin(rt, who)
    return await rt.db.write(_save_pool, None, _checked_pool(change), rt.clock.now())


async def list_pools(rt: Runtime, who: Principal) -> list[Pool]:
    await require_admin(rt, who)
    return await rt.db.read(egress.list_pools)


async def get_pool(rt: Runtime, who: Principal, pool_id: str) -> Pool:
    await require_admin(rt, who)
    return _existing(await rt.db.read(egress.get_pool, pool_id), "pool")


async def update_pool(rt: Runtime, who: Principal, pool_id: str, change: PoolChange) -> Pool:
    await require_admin(rt, who)
    return await rt.db.write(_save_pool, pool_id, _checked_pool(change), rt.clock.now())


def _delete_pool(tx: Tx, pool_id: str) -> None:
    if egress.assigned_to(tx, pool_id):
        raise Conflict(
            "the egress pool is assigned to workspaces or sending domains: assign them"
            " another pool (or none) first",
            code="pool_in_use",
        )
    if not egress.delete_pool(tx, pool_id):
        raise NotFound("no such egress pool")


async def delete_pool(rt: Runtime, who: Principal, pool_id: str) -> None:
    await require_admin(rt, who)
    await rt.db.write(_delete_pool, pool_id)


# -- assignments -------------------------------------------------------------------------


def _assign(tx: Tx, kind: str, target_id: str, pool_id: str | None, write: bool) -> str | None:
    if not egress.target_exists(tx, kind, target_id):
        raise NotFound(f"no such {'workspace' if kind == egress.WORKSPACE else 'domain'}")
    if not write:
        return egress.assigned(tx, kind, target_id)
    if pool_id is not None and egress.get_pool(tx, pool_id) is None:
        raise NotFound("no such egress pool")
    egress.assign(tx, kind, target_id, pool_id)
    return pool_id


async def assigned(rt: Runtime, who: Principal, kind: str, target_id: str) -> str | None:
    """The pool of a workspace or sending domain (None: none of its own)."""
    await require_admin(rt, who)
    return await rt.db.read(_assign, kind, target_id, None, False)


async def assign(
    rt: Runtime, who: Principal, kind: str, target_id: str, pool_id: str | None
) -> str | None:
    """Assign a workspace or sending domain a pool (None: none; a domain then goes by its
    workspace's pool, a workspace by the default egress)."""
    await require_admin(rt, who)
    return await rt.db.write(_assign, kind, target_id, pool_id, True)
