"""The webhook outbox: which email events webhooks carry, the payload each is sent as, and
their deliveries queued in the unit of work that records the events.

The engine function that has storage record events queues them here in the same unit of
work (`record`, or `queue` with the events a storage write says it recorded), so an event is
never stored without its deliveries, nor the other way round; storage never calls back into
the engine. storage/webhooks.py `fan_out` writes one delivery per active subscribed webhook.

Email events are stored under their own names (`delivered`), as the events endpoint lists
them; webhooks name them `email.delivered`. `webhook_event` is the one place that maps them.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime
from typing import Any

from storage import emails, webhooks
from storage.emails import Event
from storage.tx import Tx
from storage.webhooks import Webhook

Hooks = Callable[[], dict[str, list[Webhook]]]

_WEBHOOK_PREFIX = "email."
# The email events webhooks carry (others, such as queued or deferred, are not sent).
_SENT_TO_WEBHOOKS = (
    "sent",
    "delivered",
    "opened",
    "clicked",
    "bounced",
    "failed",
    "complained",
    "unsubscribed",
)
# Events about a sender's standing rather than one email (the complaint-rate guard,
# engine/contacts/complaint_guard.py): sent in the `postroom` format only.
SENDER_EVENTS = ("broadcast.paused", "domain.marketing_stopped")
EVENT_TYPES = (*(_WEBHOOK_PREFIX + name for name in _SENT_TO_WEBHOOKS), *SENDER_EVENTS)
"""The event types a webhook may subscribe to, as its payloads name them."""


def webhook_event(event_type: str) -> str | None:
    """The webhook name of a stored email event (`delivered` -> `email.delivered`); None when
    webhooks do not carry it."""
    return _WEBHOOK_PREFIX + event_type if event_type in _SENT_TO_WEBHOOKS else None


def payload(
    event_type: str, email_id: str, recipient: str | None, at: datetime, metadata: dict[str, Any]
) -> str:
    """The JSON body of a webhook delivery (spec: Webhook delivery, common payload fields)."""
    meta = dict(metadata)
    tags = meta.pop("tags", [])
    meta["tag"] = tags[0] if tags else None
    meta["tags"] = tags
    body = {
        "event": event_type,
        "email_id": email_id,
        "recipient": recipient,
        "timestamp": at.isoformat().replace("+00:00", "Z"),
        "metadata": meta,
    }
    return json.dumps(body, separators=(",", ":"))


def record(tx: Tx, events: Iterable[Event]) -> None:
    """Record email events and queue their webhook deliveries, in one unit of work."""
    queue(tx, emails.insert_events(tx, events))


def ahead(tx: Tx, events: Iterable[Event]) -> Hooks:
    """The webhooks `queue` will want for `events`, asked for now and read when it queues
    them: a write that knows its events before it records them (the delivery's outcome
    write) so reads them with its first statement, in one round trip (`Tx.later`)."""
    return webhooks.active_of(
        tx, {e.workspace_id for e in events if webhook_event(e.event_type) is not None}
    )


def queue(tx: Tx, events: Sequence[Event], hooks: Hooks | None = None) -> None:
    """Queue the webhook deliveries of events just recorded in this unit of work (`hooks`:
    their webhooks, when asked for `ahead`)."""
    by_workspace: dict[str, list[tuple[str, Event]]] = {}
    for e in events:
        name = webhook_event(e.event_type)
        if name is not None:
            by_workspace.setdefault(e.workspace_id, []).append((name, e))
    if not by_workspace:
        return
    active = (hooks or webhooks.active_of(tx, by_workspace))()
    for workspace_id, named in by_workspace.items():
        found = active.get(workspace_id, [])
        wanted = {event_type for hook in found for event_type in hook.events}
        # Payloads only for what some webhook takes: most workspaces have none, and the
        # delivery's outcome writes (two events per recipient) are on its hot path.
        items = [
            (name, payload(name, e.email_id, e.recipient, e.created_at, e.metadata))
            for name, e in named
            if name in wanted
        ]
        if items:
            at = max(e.created_at for e in events)
            webhooks.fan_out(tx, workspace_id, items, at, found)


def queue_sender_event(
    tx: Tx, workspace_id: str, event_type: str, data: dict[str, Any], at: datetime
) -> None:
    """Queue the webhook deliveries of a sender event (SENDER_EVENTS): `event`, `timestamp`
    and the event's own `data`, in the unit of work that made the change."""
    assert event_type in SENDER_EVENTS
    stamp = at.isoformat().replace("+00:00", "Z")
    body = json.dumps(
        {"event": event_type, "timestamp": stamp, "data": data}, separators=(",", ":")
    )
    webhooks.fan_out(tx, workspace_id, [(event_type, body)], at)
