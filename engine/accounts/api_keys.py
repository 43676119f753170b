"""API keys: create within the plan's cap, list the active ones, deactivate for good."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine import plans
from engine.accounts.passwords import new_api_key
from engine.activity import Change, record
from engine.platform.errors import NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import api_keys
from storage.api_keys import ApiKey
from storage.codec import new_id
from storage.tx import Tx

PERMISSIONS = ("send",)


@dataclass(frozen=True, slots=True)
class CreatedKey:
    key: ApiKey
    raw: str


def insert_key(
    tx: Tx,
    workspace_id: str,
    plan_name: str,
    user_id: str,
    actor: str,
    name: str,
    permissions: tuple[str, ...],
    now: datetime,
    test: bool = False,
) -> CreatedKey:
    """Create a key inside a unit of work: checks the cap, writes the key and its log entry
    (`test`: a test key, for sandbox mode only)."""
    plans.check_workspace_room(
        tx,
        workspace_id,
        plans.plan(plan_name).api_keys,
        api_keys.count_active,
        "API keys",
        plan_name,
    )
    raw, prefix, key_hash = new_api_key(test)
    key = ApiKey(
        id=new_id(),
        workspace_id=workspace_id,
        created_by=user_id,
        name=name,
        key_prefix=prefix,
        permissions=permissions,
        is_active=True,
        last_used_at=None,
        created_at=now,
    )
    api_keys.insert(tx, key, key_hash)
    record(
        tx,
        workspace_id,
        actor,
        Change("api_key.created", name, key.id, {"key_prefix": prefix}),
        now,
    )
    return CreatedKey(key, raw)


def _checked_permissions(permissions: list[str] | None) -> tuple[str, ...]:
    if permissions is None:
        return PERMISSIONS
    unknown = sorted(set(permissions) - set(PERMISSIONS))
    if unknown:
        raise Unprocessable(
            f"unknown permission {unknown[0]!r}; the only permission is 'send'",
            errors=[{"loc": ["body", "permissions"], "msg": "only 'send' exists"}],
        )
    return tuple(dict.fromkeys(permissions)) or PERMISSIONS


async def create(
    rt: Runtime, who: Principal, name: str, permissions: list[str] | None
) -> CreatedKey:
    """Create a key for the principal's workspace; PlanLimit when the cap is reached."""
    checked = _checked_permissions(permissions)
    return await rt.db.write(
        insert_key,
        who.workspace_id,
        who.plan,
        who.user_id,
        who.user_email,
        name,
        checked,
        rt.clock.now(),
    )


async def list_active(rt: Runtime, who: Principal) -> list[ApiKey]:
    return await rt.db.read(api_keys.list_active, who.workspace_id)


def _deactivate(tx: Tx, who: Principal, key_id: str, now: datetime) -> ApiKey:
    key = api_keys.get_active(tx, who.workspace_id, key_id)
    if key is None or not api_keys.deactivate(tx, who.workspace_id, key_id, now):
        raise NotFound("API key not found")
    record(tx, who.workspace_id, who.user_email, Change("api_key.deleted", key.name, key.id), now)
    tx.notify(f"key:{key.id}")  # every node's cache forgets it (engine/platform/wakeups.py)
    return key


async def delete(rt: Runtime, who: Principal, key_id: str) -> ApiKey:
    """Deactivate a key for good; NotFound for an unknown or foreign id."""
    return await rt.db.write(_deactivate, who, key_id, rt.clock.now())
