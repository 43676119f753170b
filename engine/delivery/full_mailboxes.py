"""Mailbox-full replies of one unit of work, counted per address in the database.

A delivery round (or a DSN) notes each recipient whose mailbox was full, as the deferral
(or failure) `classify` made of it, and each address it delivered to. Inside the unit that
records them, `settle` clears the counts of the addresses reached, counts the full ones
(engine/delivery/bounces.py `tally`), and turns the outcome of each address whose count has
run out into a bounce with a `hard_bounce` suppression: a mailbox full for days is gone.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from engine.delivery.bounces import Tally, tally
from engine.sending import statuses
from engine.sending.statuses import Trigger
from storage import soft_bounces
from storage.emails import Event, RecipientUpdate
from storage.suppressions import Suppression
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class _Full:
    workspace_id: str
    email_id: str
    address: str
    status: str  # the recipient's status before this outcome
    update: int | None  # its RecipientUpdate among the unit's, if it has one
    event: int  # its event among the unit's (deferred or failed)


@dataclass(slots=True)
class FullMailboxes:
    """The mailbox-full replies and deliveries of one unit of work."""

    full: list[_Full] = field(default_factory=list)
    reached: set[tuple[str, str]] = field(default_factory=set)  # (workspace id, address)

    def note_full(
        self,
        workspace_id: str,
        email_id: str,
        address: str,
        status: str,
        update: int | None,
        event: int,
    ) -> None:
        """A recipient's mailbox was full; its outcome is `updates[update]`, `events[event]`."""
        self.full.append(_Full(workspace_id, email_id, address, status, update, event))

    def note_delivered(self, workspace_id: str, address: str) -> None:
        self.reached.add((workspace_id, address))

    def settle(
        self,
        tx: Tx,
        updates: list[RecipientUpdate],
        events: list[Event],
        suppressions: list[tuple[str, Suppression]],
        now: datetime,
        among: set[tuple[str, str]] | None = None,
    ) -> list[tuple[str, str]]:
        """Count the full mailboxes (with `among`, only those of these recipients, email id
        and address: the outcomes that will be written), in the caller's unit and before its
        outcomes are written; rewrite the outcomes of those now taken as gone to bounces and
        add their suppressions. The (status before, status now) of each outcome rewritten."""
        fulls = [f for f in self.full if among is None or (f.email_id, f.address) in among]
        keys = {(f.workspace_id, f.address) for f in fulls}
        soft_bounces.clear(tx, self.reached - keys)
        if not keys:
            return []
        stored = soft_bounces.read(tx, keys)
        tallies: dict[tuple[str, str], Tally] = {}
        for key in keys:
            previous = stored.get(key)
            tallies[key] = tally(None if previous is None else Tally(*previous), now)
        soft_bounces.write(tx, {k: (t.count, t.first_at, t.last_at) for k, t in tallies.items()})
        moved = []
        for full in fulls:
            counted = tallies[(full.workspace_id, full.address)]
            if not counted.exhausted:
                continue
            before = events[full.event]
            response = before.metadata.get("response") or before.metadata.get("error")
            meta = {
                k: v for k, v in before.metadata.items() if k not in ("next_attempt_at", "error")
            }
            meta |= {
                "response": response,
                "bounce_type": "hard",
                "mailbox_full": {"count": counted.count, "since": counted.first_at.isoformat()},
            }
            events[full.event] = Event(
                before.id, before.email_id, before.workspace_id, "bounced", full.address, meta,
                before.created_at,
            )  # fmt: skip
            if full.update is not None:
                status = statuses.recipient_next(full.status, Trigger.PERMANENT)
                moved.append((updates[full.update].status, status))
                updates[full.update] = RecipientUpdate(
                    full.email_id, full.address, status, None, response
                )
            entry = Suppression(full.address, "hard_bounce", now, full.email_id)
            suppressions.append((full.workspace_id, entry))
        return moved
