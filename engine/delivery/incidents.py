"""Destination incidents: how long a sender-side block or rate limit pauses a destination.

`classify` (engine/delivery/classify.py) names an incident's kind; a delivery round records
its hits per (workspace, sending domain) in storage/incidents.py, which no node claims
recipients for while paused. Rules:
- The pause starts at the kind's first step and doubles with each round that hits the open
  incident again, up to the kind's ceiling: a block is a slow thing to lift, a rate limit
  usually a matter of minutes.
- A round that delivers to the pair without a hit resolves the incident: the destination is
  open at full speed again.
- The recipients themselves follow the retry schedule (and the 72-hour limit) like any
  deferral, and are never suppressed.
"""

from __future__ import annotations

from datetime import timedelta

from engine.delivery.classify import IncidentKind
from engine.platform.runtime import Principal, Runtime
from storage import incidents
from storage.incidents import Incident

# kind -> (first pause, longest pause)
PAUSES: dict[IncidentKind, tuple[timedelta, timedelta]] = {
    IncidentKind.BLOCKED: (timedelta(minutes=15), timedelta(hours=4)),
    IncidentKind.UNAUTHENTICATED: (timedelta(minutes=15), timedelta(hours=4)),
    IncidentKind.RATE_LIMITED: (timedelta(minutes=1), timedelta(hours=1)),
    IncidentKind.DNS: (timedelta(minutes=1), timedelta(minutes=30)),
}


def pause_for(kind: str, strikes: int) -> timedelta:
    """How long the `strikes`-th hit (>= 1) of an open incident of `kind` pauses it."""
    first, longest = PAUSES[IncidentKind(kind)]
    widened: timedelta = first * 2 ** min(strikes - 1, 16)
    return min(widened, longest)


async def listed(rt: Runtime, who: Principal, state: str, limit: int) -> list[Incident]:
    """The workspace's incidents in `state`, most recently seen first."""
    return await rt.db.read(incidents.of_workspace, who.workspace_id, state, limit)
