"""Batch sending: up to the plan's batch size of emails, each accepted or refused on its own.

Entries are sent concurrently, so group commit stores the whole batch in a few transactions;
results keep the order of the request. An entry that fails validation or a rule gets
`{"id": null, "status": "error", "rejection_reason": ...}` and does not affect the others.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from engine import plans
from engine.errors import EngineError, InvalidRequest
from engine.runtime import Principal, Runtime
from engine.sending.intake import SendRequest, SendResult, send


@dataclass(frozen=True, slots=True)
class BatchEntry:
    result: SendResult | None
    error: str | None


def check_size(who: Principal, size: int) -> None:
    """PlanFeature below Starter; InvalidRequest over the plan's batch size or when empty."""
    plan = plans.plan(who.plan)
    plans.require(plan.batch_size > 0, "Batch sending", plan.name)
    if size == 0:
        raise InvalidRequest("the batch is empty")
    if size > plan.batch_size:
        raise InvalidRequest(
            f"the {plan.name} plan sends at most {plan.batch_size} emails a batch; this one has {size}",
            code="batch_too_large",
        )


async def send_batch(
    rt: Runtime, who: Principal, entries: list[SendRequest | str]
) -> list[BatchEntry]:
    """Send every entry; a string entry is one that already failed to parse (its reason)."""
    check_size(who, len(entries))
    results: list[BatchEntry | None] = [None] * len(entries)

    async def one(index: int, request: SendRequest) -> None:
        try:
            results[index] = BatchEntry(await send(rt, who, request, source="api"), None)
        except EngineError as exc:
            results[index] = BatchEntry(None, exc.detail)

    async with trio.open_nursery() as nursery:
        for index, entry in enumerate(entries):
            if isinstance(entry, str):
                results[index] = BatchEntry(None, entry)
            else:
                nursery.start_soon(one, index, entry)
    return [entry for entry in results if entry is not None]
