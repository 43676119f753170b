"""Destination policies and warm-up ramps as workspace resources (`/v1/delivery/...`).

Every read and write is scoped by the workspace, and every change writes its activity entry
in the same unit of work (`delivery_policy.*`, `delivery_ramp.*`, category Send). Built-in
policies are listed and readable but never changed: a workspace overrides one by creating a
rule with the same match. Delivery reads the rules afresh for every round, so a change
applies to the next round on every node.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import date, datetime
from typing import Any

from engine.activity import Change, record
from engine.delivery import policies
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import delivery_policies as stored
from storage import domains
from storage.codec import new_id
from storage.delivery_policies import LIMIT_FIELDS, Ramp, Rule
from storage.tx import Tx

_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_DOMAIN = re.compile(rf"{_LABEL}(?:\.{_LABEL})+")
MAX_FACTOR = 10.0


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def checked_match(value: str) -> str:
    """`example.com` or `*.example.com`, lower-cased; 422 otherwise."""
    match = value.strip().lower().rstrip(".")
    name = match[2:] if match.startswith("*.") else match
    if len(match) > 253 or not _DOMAIN.fullmatch(name):
        raise _invalid(
            "match",
            "match must be a recipient domain (gmail.com) or an MX host suffix (*.google.com)",
        )
    return match


async def _checked_domain(rt: Runtime, who: Principal, domain_id: str | None) -> None:
    if domain_id is not None and await rt.db.read(domains.get, who.workspace_id, domain_id) is None:
        raise NotFound("no such domain in this workspace")


# -- policies ----------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PolicyChange:
    """The fields a request sets; a limit set to None clears it."""

    match: str | None = None
    domain_id: str | None = None
    domain_given: bool = False
    limits: dict[str, int | None] | None = None


def _has_a_limit(rule: Rule) -> None:
    if all(getattr(rule, name) is None for name in LIMIT_FIELDS):
        raise _invalid("max_connections", f"set at least one of: {', '.join(LIMIT_FIELDS)}")


def _save_rule(tx: Tx, who: Principal, rule: Rule, verb: str) -> Rule:
    if stored.rule_exists(tx, who.workspace_id, rule.domain_id, rule.match, rule.id):
        raise Conflict(
            f"a policy for {rule.match} with this scope exists already", code="policy_exists"
        )
    stored.save_rule(tx, rule)
    meta: dict[str, Any] = {name: getattr(rule, name) for name in LIMIT_FIELDS}
    meta["domain_id"] = rule.domain_id
    assert rule.updated_at is not None
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change(f"delivery_policy.{verb}", rule.match, rule.id, meta),
        rule.updated_at,
    )
    return rule


async def create_policy(rt: Runtime, who: Principal, change: PolicyChange) -> Rule:
    assert change.match is not None
    await _checked_domain(rt, who, change.domain_id)
    now = rt.clock.now()
    limits = change.limits or {}
    rule = Rule(
        id=new_id(),
        workspace_id=who.workspace_id,
        domain_id=change.domain_id,
        match=checked_match(change.match),
        max_connections=limits.get("max_connections"),
        messages_per_connection=limits.get("messages_per_connection"),
        per_minute=limits.get("per_minute"),
        per_hour=limits.get("per_hour"),
        per_day=limits.get("per_day"),
        created_at=now,
        updated_at=now,
    )
    _has_a_limit(rule)
    return await rt.db.write(_save_rule, who, rule, "created")


async def list_policies(rt: Runtime, who: Principal) -> list[Rule]:
    """The workspace's rules, then the built-in ones."""
    return [*await rt.db.read(stored.list_rules, who.workspace_id), *policies.BUILTIN]


def _builtin(rule_id: str) -> Rule | None:
    return next((r for r in policies.BUILTIN if r.id == rule_id), None)


async def get_policy(rt: Runtime, who: Principal, rule_id: str) -> Rule:
    found = _builtin(rule_id) or await rt.db.read(stored.get_rule, who.workspace_id, rule_id)
    if found is None:
        raise NotFound("no such delivery policy")
    return found


def _read_only(rule_id: str) -> None:
    if _builtin(rule_id) is not None:
        raise Conflict(
            "built-in policies cannot be changed; create a policy with the same match to"
            " override it",
            code="builtin_policy",
        )


async def update_policy(rt: Runtime, who: Principal, rule_id: str, change: PolicyChange) -> Rule:
    _read_only(rule_id)
    found = await get_policy(rt, who, rule_id)
    if change.domain_given:
        await _checked_domain(rt, who, change.domain_id)
    limits = change.limits or {}

    def limit(name: str) -> int | None:
        return limits[name] if name in limits else getattr(found, name)

    rule = replace(
        found,
        match=found.match if change.match is None else checked_match(change.match),
        domain_id=change.domain_id if change.domain_given else found.domain_id,
        max_connections=limit("max_connections"),
        messages_per_connection=limit("messages_per_connection"),
        per_minute=limit("per_minute"),
        per_hour=limit("per_hour"),
        per_day=limit("per_day"),
        updated_at=rt.clock.now(),
    )
    _has_a_limit(rule)
    return await rt.db.write(_save_rule, who, rule, "updated")


def _delete_rule(tx: Tx, who: Principal, rule_id: str, now: datetime) -> None:
    found = stored.get_rule(tx, who.workspace_id, rule_id)
    if found is None or not stored.delete_rule(tx, who.workspace_id, rule_id):
        raise NotFound("no such delivery policy")
    change = Change("delivery_policy.deleted", found.match, rule_id)
    record(tx, who.workspace_id, who.user_email, change, now)


async def delete_policy(rt: Runtime, who: Principal, rule_id: str) -> None:
    _read_only(rule_id)
    await rt.db.write(_delete_rule, who, rule_id, rt.clock.now())


# -- ramps -------------------------------------------------------------------------------


def _checked_ramp(ramp: Ramp) -> Ramp:
    if not 1.0 <= ramp.factor <= MAX_FACTOR:
        raise _invalid("factor", f"factor must be from 1 to {MAX_FACTOR:g}")
    if ramp.target_per_day <= ramp.first_day:
        raise _invalid("target_per_day", "target_per_day must be more than first_day")
    return ramp


def _save_ramp(tx: Tx, who: Principal, ramp: Ramp, verb: str) -> Ramp:
    other = stored.ramp_for_domain(tx, who.workspace_id, ramp.domain_id)
    if other is not None and other.id != ramp.id:
        raise Conflict("this sending domain has a warm-up ramp already", code="ramp_exists")
    stored.save_ramp(tx, ramp)
    meta = {
        "domain_id": ramp.domain_id,
        "first_day": ramp.first_day,
        "factor": ramp.factor,
        "target_per_day": ramp.target_per_day,
    }
    change = Change(f"delivery_ramp.{verb}", ramp.domain_id, ramp.id, meta)
    record(tx, who.workspace_id, who.user_email, change, ramp.updated_at)
    return ramp


async def create_ramp(
    rt: Runtime,
    who: Principal,
    domain_id: str,
    first_day: int,
    factor: float,
    target_per_day: int,
    starts_on: date | None,
) -> Ramp:
    await _checked_domain(rt, who, domain_id)
    now = rt.clock.now()
    ramp = Ramp(
        id=new_id(),
        workspace_id=who.workspace_id,
        domain_id=domain_id,
        first_day=first_day,
        factor=factor,
        target_per_day=target_per_day,
        starts_on=starts_on or now.date(),
        created_at=now,
        updated_at=now,
    )
    return await rt.db.write(_save_ramp, who, _checked_ramp(ramp), "created")


async def list_ramps(rt: Runtime, who: Principal) -> list[Ramp]:
    return await rt.db.read(stored.list_ramps, who.workspace_id)


async def get_ramp(rt: Runtime, who: Principal, ramp_id: str) -> Ramp:
    found = await rt.db.read(stored.get_ramp, who.workspace_id, ramp_id)
    if found is None:
        raise NotFound("no such warm-up ramp")
    return found


async def update_ramp(rt: Runtime, who: Principal, ramp_id: str, fields: dict[str, Any]) -> Ramp:
    found = await get_ramp(rt, who, ramp_id)
    ramp = _checked_ramp(replace(found, updated_at=rt.clock.now(), **fields))
    return await rt.db.write(_save_ramp, who, ramp, "updated")


def _delete_ramp(tx: Tx, who: Principal, ramp_id: str, now: datetime) -> None:
    found = stored.get_ramp(tx, who.workspace_id, ramp_id)
    if found is None or not stored.delete_ramp(tx, who.workspace_id, ramp_id):
        raise NotFound("no such warm-up ramp")
    change = Change("delivery_ramp.deleted", found.domain_id, ramp_id)
    record(tx, who.workspace_id, who.user_email, change, now)


async def delete_ramp(rt: Runtime, who: Principal, ramp_id: str) -> None:
    await rt.db.write(_delete_ramp, who, ramp_id, rt.clock.now())
