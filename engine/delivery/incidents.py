"""Destination incidents: how long a sender-side block or rate limit pauses a destination.

`classify` (engine/delivery/classify.py) names an incident's kind; a delivery round records
its hits per (workspace, sending domain) in storage/incidents.py, which no node claims
recipients for while paused. Rules:
- The pause starts at the kind's first step and doubles with each round that hits the open
  incident again, up to the kind's ceiling: a block is a slow thing to lift, a rate limit
  usually a matter of minutes.
- A round that delivers to the pair without a hit resolves the incident: the destination is
  open at full speed again.
- A person may resolve an open incident (they fixed what the destination complained of): its
  pause ends at once, and the next hit opens a new one. The activity log says who.
- The recipients themselves follow the retry schedule (and the 72-hour limit) like any
  deferral, and are never suppressed.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta

from engine.activity import Change, record
from engine.delivery.classify import IncidentKind
from engine.platform.errors import Conflict, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import incidents
from storage.incidents import Incident
from storage.tx import Tx

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


def _resolve(tx: Tx, who: Principal, incident_id: str, now: datetime) -> Incident:
    found = incidents.get(tx, who.workspace_id, incident_id)
    if found is None:
        raise NotFound("no such delivery incident")
    if not incidents.resolve(tx, found, now):
        raise Conflict("this incident is resolved already", code="incident_resolved")
    name = f"{found.destination} ({found.sending_domain})"
    meta = {"destination": found.destination, "kind": found.kind, "strikes": found.strikes}
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("delivery_incident.resolved", name, incident_id, meta),
        now,
    )
    return replace(found, resolved_at=now)


async def resolve(rt: Runtime, who: Principal, incident_id: str) -> Incident:
    """Resolve the workspace's open incident `incident_id`: its destination is open again."""
    resolved: Incident = await rt.db.write(_resolve, who, incident_id, rt.clock.now())
    return resolved
