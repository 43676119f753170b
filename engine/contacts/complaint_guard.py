"""The complaint-rate guard (issue 31, section 4): broadcasts from a sending domain whose
recipients complain too often pause by themselves, until a person resumes them.

The rate is complaints (ARF feedback loops, abuse@ reports: engine/forwarding/feedback.py)
over recipients delivered, both for the domain's mail created in the last WINDOW: the same
cohort of mail on both sides, so a complaint about an old email does not count against
today's volume. Below MIN_DELIVERIES the rate means nothing (one complaint on a first
hundred emails is 1%) and nothing is paused. The check is one statement
(storage/complaint_rates.py) run once per complaint report, in its transaction.

Above PAUSE_RATE (the 0.1% the big mailbox providers ask bulk senders to stay under), each of
the domain's broadcasts with mail still waiting becomes `paused` (reason `complaint_rate`):
its waiting recipients are held (the queue's own `hold`, engine/sending/queue_actions.py),
with an activity entry `broadcast.paused`. `resume` releases a paused broadcast's mail.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from engine.activity import Change, record
from engine.errors import Conflict, NotFound
from engine.runtime import Principal, Runtime
from engine.sending import statuses
from engine.sending.queue_actions import moves
from engine.sending.statuses import Trigger
from engine.webhooks import outbox
from storage import broadcasts, complaint_rates, queue_actions
from storage.broadcasts import Broadcast
from storage.emails import Email, Search
from storage.tx import Tx

WINDOW = timedelta(days=30)
MIN_DELIVERIES = 1_000
PAUSE_RATE = 0.001
REASON = "complaint_rate"
ACTOR = "postroom"  # the activity entry's actor when the guard, not a person, acts


def _only(broadcast_id: str) -> Search:
    return Search([], [], [], [], [], [], [], broadcasts=[broadcast_id])


def check(tx: Tx, email: Email, now: datetime) -> list[Broadcast]:
    """After a complaint about `email`: pause its domain's broadcasts if the rate passed
    PAUSE_RATE; the broadcasts paused."""
    counts = complaint_rates.since(tx, email.workspace_id, email.domain_id, now - WINDOW)
    if counts.delivered < MIN_DELIVERIES or counts.complained <= PAUSE_RATE * counts.delivered:
        return []
    paused = broadcasts.pausable(tx, email.workspace_id, email.domain_id)
    rate = round(counts.complained / counts.delivered, 6)
    for broadcast in paused:
        held = queue_actions.move(
            tx,
            email.workspace_id,
            _only(broadcast.id),
            moves(Trigger.HOLD),
            "keep",
            False,
            ("held", {"action": "pause", "reason": REASON}),
            now,
            statuses.SUMMARISE,
            outbox.queue,
        )
        broadcasts.set_paused(tx, broadcast.id, REASON, "paused", now)
        meta = {
            "reason": REASON,
            "complaint_rate": rate,
            "complaints": counts.complained,
            "delivered": counts.delivered,
            "held": held.recipients,
        }
        change = Change("broadcast.paused", broadcast.name, broadcast.id, meta)
        record(tx, email.workspace_id, ACTOR, change, now)
    return paused


def _resume(tx: Tx, who: Principal, broadcast_id: str, now: datetime) -> Broadcast:
    found = broadcasts.get(tx, who.workspace_id, broadcast_id)
    if found is None:
        raise NotFound("broadcast not found")
    if found.status != "paused":
        raise Conflict(f"the broadcast is {found.status}, not paused", code="not_paused")
    released = queue_actions.move(
        tx,
        who.workspace_id,
        _only(found.id),
        moves(Trigger.RELEASE),
        "now",
        True,  # held time is the sender's, not the destination's (as a queue release)
        ("released", {"action": "resume"}),
        now,
        statuses.SUMMARISE,
        outbox.queue,
    )
    status = "sending" if found.finished_at is None else "sent"
    broadcasts.set_paused(tx, found.id, None, status, now)
    meta = {"released": released.recipients, "reason": found.pause_reason}
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("broadcast.resumed", found.name, found.id, meta),
        now,
    )
    resumed = broadcasts.get(tx, who.workspace_id, found.id)
    assert resumed is not None
    return resumed


async def resume(rt: Runtime, who: Principal, broadcast_id: str) -> Broadcast:
    """Release a paused broadcast's held mail (due at once) and put it back to `sent`."""
    resumed: Broadcast = await rt.db.write(_resume, who, broadcast_id, rt.clock.now())
    return resumed
