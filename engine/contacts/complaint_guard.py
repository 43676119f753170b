"""The complaint-rate guard (issue 31, section 4): a sending domain whose recipients complain
too often has its broadcasts paused, and then its mail that offers unsubscribe stopped, by
itself, until a person resumes them.

The rate is complaints (ARF feedback loops, abuse@ reports: engine/forwarding/feedback.py)
over recipients delivered, both for the domain's mail created in the last COMPLAINT_WINDOW: the
same cohort of mail on both sides, so a complaint about an old email does not count against
today's volume. It is one statement (storage/complaint_rates.py), run once per complaint
report, in its transaction; the limits and window are engine/platform/settings.py.

- Above the pause rate (the workspace's own, within PAUSE_RATE_BOUNDS, else 0.1%), each of the domain's broadcasts with mail still waiting becomes
  `paused` (reason `complaint_rate`): its waiting recipients are held (the queue's own
  `hold`, engine/sending/queue_actions.py), with an activity entry and a webhook event
  `broadcast.paused`; what a paused broadcast still queues is held as it is queued
  (`hold_if_paused`). `resume` releases one paused broadcast's mail, due at once.
- Above the stop rate, the domain's other mail that offers unsubscribe (marketing mail,
  engine/suppressions/scopes.py) is held too, and new such mail is refused (409
  `marketing_stopped`, for single sends and bulk sends alike), with an activity entry and a
  webhook event `domain.marketing_stopped`; mail without unsubscribe (receipts, resets) still goes.
  `resume_marketing` lets it go again and releases what was held; broadcasts stay paused
  until each is resumed, and none resumes while the domain is stopped.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from engine.activity import Change, record
from engine.domains.marketing import stopped_problem
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.platform.settings import (
    COMPLAINT_WINDOW,
    PAUSE_RATE,
    PAUSE_RATE_BOUNDS,
    ComplaintLimits,
)
from engine.sending import statuses
from engine.sending.queue_actions import moves
from engine.sending.statuses import Trigger
from engine.webhooks import outbox
from storage import broadcasts, complaint_rates, domains, queue_actions
from storage.broadcasts import Broadcast
from storage.complaint_rates import Counts
from storage.domains import Domain
from storage.emails import Email, Search
from storage.queue_actions import Due, Touched
from storage.tx import Tx

REASON = "complaint_rate"
ACTOR = "postroom"  # the activity entry's actor when the guard, not a person, acts

# action -> (trigger, next attempt, new 72-hour window): as the queue's hold and release.
_HOLD: tuple[Trigger, Due, bool] = (Trigger.HOLD, "keep", False)
_RELEASE: tuple[Trigger, Due, bool] = (Trigger.RELEASE, "now", True)


def _search(**only: Any) -> Search:
    return Search([], [], [], [], [], [], [], **only)


def _move(
    tx: Tx, workspace_id: str, query: Search, release: bool, action: str, now: datetime
) -> Touched:
    trigger, due, new_window = _RELEASE if release else _HOLD
    event = ("released" if release else "held", {"action": action, "reason": REASON})
    touched, events = queue_actions.move(
        tx, workspace_id, query, moves(trigger), due, new_window, event, now, statuses.SUMMARISE
    )
    outbox.queue(tx, events)
    return touched


def _evidence(counts: Counts) -> dict[str, Any]:
    return {
        "reason": REASON,
        "complaint_rate": round(counts.complained / counts.delivered, 6),
        "complaints": counts.complained,
        "delivered": counts.delivered,
    }


def check(tx: Tx, email: Email, now: datetime, limits: ComplaintLimits) -> None:
    """After a complaint about `email`: pause its domain's broadcasts, and stop its marketing
    mail, as the domain's complaint rate passes the limits."""
    counts = complaint_rates.since(tx, email.workspace_id, email.domain_id, now - COMPLAINT_WINDOW)
    if counts.delivered < limits.min_deliveries:
        return
    if counts.complained > limits.stop_rate * counts.delivered:
        domain = domains.get(tx, email.workspace_id, email.domain_id)
        if domain is not None and domain.marketing_stopped_at is None:
            domains.set_marketing_stopped(tx, email.workspace_id, domain.id, now)
            held = _move(
                tx, email.workspace_id, _search(marketing_of=[domain.id]), False, "stop", now
            )
            meta = {**_evidence(counts), "stop_rate": limits.stop_rate, "held": held.recipients}
            change = Change("domain.marketing_stopped", domain.name, domain.id, meta)
            record(tx, email.workspace_id, ACTOR, change, now)
            data = {"domain_id": domain.id, "domain": domain.name, **meta}
            outbox.queue_sender_event(tx, email.workspace_id, change.action, data, now)
    pause_rate = limits.pause_rate if counts.pause_rate is None else counts.pause_rate
    if counts.complained > pause_rate * counts.delivered:
        for broadcast in broadcasts.pausable(
            tx, email.workspace_id, email.domain_id, statuses.WAITING
        ):
            only = _search(broadcasts=[broadcast.id])
            held = _move(tx, email.workspace_id, only, False, "pause", now)
            broadcasts.set_paused(tx, broadcast.id, REASON, "paused", now)
            meta = {**_evidence(counts), "pause_rate": pause_rate, "held": held.recipients}
            change = Change("broadcast.paused", broadcast.name, broadcast.id, meta)
            record(tx, email.workspace_id, ACTOR, change, now)
            data = {"broadcast_id": broadcast.id, "domain_id": broadcast.domain_id, **meta}
            outbox.queue_sender_event(tx, email.workspace_id, change.action, data, now)


def hold_if_paused(tx: Tx, broadcast: Broadcast, now: datetime) -> None:
    """Hold what a broadcast still queuing just queued, when it was paused meanwhile."""
    current = broadcasts.get(tx, broadcast.workspace_id, broadcast.id)
    if current is not None and current.status == "paused":
        _move(tx, broadcast.workspace_id, _search(broadcasts=[broadcast.id]), False, "pause", now)


def _resume(tx: Tx, who: Principal, broadcast_id: str, now: datetime) -> Broadcast:
    found = broadcasts.get(tx, who.workspace_id, broadcast_id)
    if found is None:
        raise NotFound("broadcast not found")
    if found.status != "paused":
        raise Conflict(f"the broadcast is {found.status}, not paused", code="not_paused")
    domain = domains.get(tx, who.workspace_id, found.domain_id)
    if domain is not None and (problem := stopped_problem(domain)):
        raise Conflict(problem, code="marketing_stopped")
    released = _move(tx, who.workspace_id, _search(broadcasts=[found.id]), True, "resume", now)
    status = "sending" if found.finished_at is None else "sent"
    broadcasts.set_paused(tx, found.id, None, status, now)
    meta = {"released": released.recipients, "reason": found.pause_reason}
    change = Change("broadcast.resumed", found.name, found.id, meta)
    record(tx, who.workspace_id, who.user_email, change, now)
    resumed = broadcasts.get(tx, who.workspace_id, found.id)
    assert resumed is not None
    return resumed


async def resume(rt: Runtime, who: Principal, broadcast_id: str) -> Broadcast:
    """Release a paused broadcast's held mail (due at once) and put it back to `sent`."""
    resumed: Broadcast = await rt.db.write(_resume, who, broadcast_id, rt.clock.now())
    return resumed


def _resume_marketing(tx: Tx, who: Principal, domain_id: str, now: datetime) -> Domain:
    found = domains.get(tx, who.workspace_id, domain_id)
    if found is None:
        raise NotFound("domain not found")
    if found.marketing_stopped_at is None:
        raise Conflict(f"mail from {found.name} is not stopped", code="not_stopped")
    domains.set_marketing_stopped(tx, who.workspace_id, found.id, None)
    released = _move(tx, who.workspace_id, _search(marketing_of=[found.id]), True, "resume", now)
    meta = {"released": released.recipients, "stopped_at": found.marketing_stopped_at.isoformat()}
    change = Change("domain.marketing_resumed", found.name, found.id, meta)
    record(tx, who.workspace_id, who.user_email, change, now)
    resumed = domains.get(tx, who.workspace_id, found.id)
    assert resumed is not None
    return resumed


async def resume_marketing(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    """Let the domain's mail that offers unsubscribe go again, releasing what was held."""
    resumed: Domain = await rt.db.write(_resume_marketing, who, domain_id, rt.clock.now())
    return resumed


@dataclass(frozen=True, slots=True)
class Settings:
    """What a workspace sees of the guard: its pause rate, and the limits it cannot change."""

    pause_rate: float
    default_pause_rate: float
    pause_rate_bounds: tuple[float, float]
    stop_rate: float
    min_deliveries: int
    window_days: int


def _settings(limits: ComplaintLimits, own: float | None) -> Settings:
    return Settings(
        pause_rate=PAUSE_RATE if own is None else own,
        default_pause_rate=PAUSE_RATE,
        pause_rate_bounds=PAUSE_RATE_BOUNDS,
        stop_rate=limits.stop_rate,
        min_deliveries=limits.min_deliveries,
        window_days=COMPLAINT_WINDOW.days,
    )


async def settings(rt: Runtime, who: Principal) -> Settings:
    own = await rt.db.read(complaint_rates.pause_rate, who.workspace_id)
    return _settings(rt.complaint_limits, own)


def _set_pause_rate(tx: Tx, who: Principal, rate: float | None, now: datetime) -> None:
    complaint_rates.set_pause_rate(tx, who.workspace_id, rate)
    meta = {"pause_rate": rate}
    change = Change("complaint_guard.updated", "complaint-rate guard", None, meta)
    record(tx, who.workspace_id, who.user_email, change, now)


async def set_pause_rate(rt: Runtime, who: Principal, rate: float | None) -> Settings:
    """Set the workspace's pause rate (None: back to the default), within the bounds (422)."""
    low, high = PAUSE_RATE_BOUNDS
    if rate is not None and not low <= rate <= high:
        message = f"pause_rate must be between {low} and {high} (a fraction: 0.001 is 0.1%)"
        raise Unprocessable(message, errors=[{"loc": ["body", "pause_rate"], "msg": message}])
    await rt.db.write(_set_pause_rate, who, rate, rt.clock.now())
    return _settings(rt.complaint_limits, rate)
