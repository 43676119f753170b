"""Queue actions by search (`POST /v1/queue/actions`): hold, release, cancel or retry now the
mail an email-log search matches, in the caller's workspace.

Rules:
- The search is the email log's (`email_log.parse_query`): one meaning for every token.
- Which recipients move, and where to, is the recipient transition table
  (engine/sending/statuses.py): hold takes waiting recipients to `held`, release takes held
  ones to `queued`, cancel takes waiting and held ones to `cancelled`, retry now makes waiting
  ones due at once. A released recipient starts a new 72-hour window: held time is the
  operator's, not the destination's, so it never counts towards giving up.
- A real action writes one activity entry (`queue.<verb>`, category Send) in its own unit of
  work; a dry run only counts, changes nothing and logs nothing.
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from engine.activity import Change, record
from engine.platform.errors import Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sending import email_log, statuses
from engine.sending.statuses import Trigger
from engine.webhooks import outbox
from storage import queue_actions
from storage.emails import Search
from storage.queue_actions import Due, Touched
from storage.tx import Tx

Action = Literal["retry_now", "hold", "release", "cancel"]

# action -> (trigger, next attempt, new 72-hour window, event, activity verb)
_ACTIONS: dict[str, tuple[Trigger, Due, bool, str, str]] = {
    "hold": (Trigger.HOLD, "keep", False, "held", "held"),
    "release": (Trigger.RELEASE, "now", True, "released", "released"),
    "cancel": (Trigger.CANCEL, "none", False, "cancelled", "cancelled"),
    "retry_now": (Trigger.RETRY_NOW, "now", False, "retried_now", "retried"),
}
ACTIONS = tuple(_ACTIONS)
# Statuses a queue action ever moves a recipient from.
_MOVABLE = (*statuses.WAITING, statuses.HELD)


def moves(trigger: Trigger) -> dict[str, str]:
    """From which statuses `trigger` moves a recipient, and to which, by the status table."""
    return {
        current: target
        for (current, moved_by), target in statuses.RECIPIENT_TRANSITIONS.items()
        if moved_by is trigger and current in _MOVABLE
    }


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def _checked(q: str) -> Search:
    if not q.strip():
        raise _invalid("q", "q must say which mail to act on (an empty search takes it all)")
    return email_log.parse_query(q, where="body")  # refuses unknown tokens and statuses


def _act(
    tx: Tx, who: Principal, q: str, query: Search, action: str, dry_run: bool, now: datetime
) -> Touched:
    trigger, due, new_window, event_type, verb = _ACTIONS[action]
    if dry_run:
        return queue_actions.count(tx, who.workspace_id, query, moves(trigger), now)
    event = (event_type, {"action": action, "q": q})
    touched, events = queue_actions.move(
        tx, who.workspace_id, query, moves(trigger), due, new_window, event, now, statuses.SUMMARISE
    )
    outbox.queue(tx, events)
    meta = {"q": q, "action": action, "emails": touched.emails, "recipients": touched.recipients}
    record(tx, who.workspace_id, who.user_email, Change(f"queue.{verb}", q, None, meta), now)
    return touched


async def act(rt: Runtime, who: Principal, q: str, action: str, dry_run: bool) -> Touched:
    """Apply `action` to the mail `q` matches (dry run: count it); what it touched."""
    if action not in _ACTIONS:
        raise _invalid("action", f"action must be one of: {', '.join(ACTIONS)}")
    query = _checked(q)
    touched: Touched = await rt.db.write(_act, who, q, query, action, dry_run, rt.clock.now())
    return touched
