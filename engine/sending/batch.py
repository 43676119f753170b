"""Batch sending: up to the plan's batch size of emails, each accepted or refused on its own.

The whole batch is one unit of work (engine/sending/intake.py `send_many`): its accepted
emails are stored in multi-row statements, results keep the order of the request. An entry
that fails validation or a rule gets `{"id": null, "status": "error", "rejection_reason":
...}` and does not affect the others.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import plans
from engine.platform.errors import EngineError, InvalidRequest
from engine.platform.runtime import Principal, Runtime
from engine.sending.intake import SendRequest, SendResult, send_many


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
    requests = [entry for entry in entries if not isinstance(entry, str)]
    sent = iter(await send_many(rt, who, requests))
    results = []
    for entry in entries:
        outcome = entry if isinstance(entry, str) else next(sent)
        if isinstance(outcome, str):
            results.append(BatchEntry(None, outcome))
        elif isinstance(outcome, EngineError):
            results.append(BatchEntry(None, outcome.detail))
        else:
            results.append(BatchEntry(outcome, None))
    return results
