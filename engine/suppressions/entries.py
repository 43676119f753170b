"""The suppression list: addresses that are never sent to until removed."""

from __future__ import annotations

from datetime import datetime

from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform.errors import NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import suppressions
from storage.suppressions import Suppression
from storage.tx import Tx

REASONS = ("hard_bounce", "complaint", "unsubscribe", "manual")


def _add(tx: Tx, who: Principal, entry: Suppression) -> tuple[Suppression, bool]:
    if not suppressions.add(tx, who.workspace_id, entry):
        existing = suppressions.get(tx, who.workspace_id, entry.email)
        assert existing is not None
        return existing, False
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("suppression.created", entry.email, None, {"reason": entry.reason}),
        entry.created_at,
    )
    return entry, True


async def add(rt: Runtime, who: Principal, email: str, reason: str) -> tuple[Suppression, bool]:
    """Suppress an address; the entry and whether it is new (an existing one is kept)."""
    if reason not in REASONS:
        message = f"reason must be one of {', '.join(REASONS)}"
        raise Unprocessable(message, errors=[{"loc": ["body", "reason"], "msg": message}])
    entry = Suppression(normalize_email(email), reason, rt.clock.now(), None)
    return await rt.db.write(_add, who, entry)


async def page(
    rt: Runtime, who: Principal, page_number: int, limit: int, search: str | None
) -> tuple[list[Suppression], int]:
    return await rt.db.read(suppressions.page, who.workspace_id, page_number * limit, limit, search)


def _remove(tx: Tx, who: Principal, email: str, now: datetime) -> None:
    if not suppressions.remove(tx, who.workspace_id, email):
        raise NotFound(f"{email} is not suppressed")
    record(tx, who.workspace_id, who.user_email, Change("suppression.deleted", email, None), now)


async def remove(rt: Runtime, who: Principal, email: str) -> None:
    """Lift a suppression, so mail to the address is sent again."""
    try:
        address = normalize_email(email)
    except Unprocessable:
        raise NotFound(f"{email!r} is not suppressed") from None
    await rt.db.write(_remove, who, address, rt.clock.now())
