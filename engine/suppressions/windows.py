"""Where each suppressed address stands in its 24-hour override window (engine/suppressions/
override.py), told the way the console shows it: no window, one send allowed, or used."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.platform.runtime import Principal, Runtime
from engine.suppressions.override import WINDOW, OverrideState, Verdict, decide
from storage import suppressions


@dataclass(frozen=True, slots=True)
class Window:
    state: str  # none, open (one send would go out), used (sends are rejected)
    closes_at: datetime | None


async def windows(rt: Runtime, who: Principal, addresses: list[str]) -> dict[str, Window]:
    """The override window of each address now."""
    found = await rt.db.read(suppressions.overrides, who.workspace_id, addresses)
    now = rt.clock.now()
    result: dict[str, Window] = {}
    for address in addresses:
        stored = found.get(address)
        state = None if stored is None else OverrideState(*stored)
        verdict = decide(state, now)
        if state is None or verdict is Verdict.REJECT_AND_OPEN_WINDOW:
            result[address] = Window("none", None)
        else:
            closes = state.rejected_at + WINDOW
            result[address] = Window("open" if verdict is Verdict.ALLOW_ONCE else "used", closes)
    return result
