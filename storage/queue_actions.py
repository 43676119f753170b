"""Queue actions by search: move the waiting (or held) recipients of the emails an email-log
search matches, in one unit of work and a fixed number of statements whatever their number.

The emails are the ones `emails.search_clauses` matches (the email log's own rule), except
those scheduled, cancelled or rejected, which have actions of their own. Recipients leased
by a delivery round are on the wire now and are left alone. `destination:` tokens narrow the
recipients to those domains.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

from storage import emails
from storage.codec import new_id, timestamp
from storage.emails import Event, Search
from storage.tx import Tx

SUMMARISE_CHUNK = 500  # email ids per summary statement (SQLite binds at most 32,766)

# What a move does to the recipient's next attempt: due now, kept, or none (final).
Due = Literal["now", "keep", "none"]


@dataclass(frozen=True, slots=True)
class Touched:
    emails: int
    recipients: int


def _matching(
    workspace_id: str, query: Search, from_statuses: list[str], now: datetime
) -> tuple[str, dict[str, Any]]:
    """The condition over `email_recipients` for the recipients an action takes."""
    params: dict[str, Any] = {"now": timestamp(now)}
    matched = emails.search_clauses(workspace_id, query, params)
    states = {f"s{i}": status for i, status in enumerate(from_statuses)}
    params.update(states)
    where = (
        f"status IN ({', '.join(f':{name}' for name in states)})"
        " AND (lease_until IS NULL OR lease_until < :now)"
        f" AND email_id IN (SELECT id FROM emails WHERE {matched}"
        " AND status NOT IN ('scheduled', 'cancelled', 'rejected'))"
    )
    if query.destinations:
        domains = {f"d{i}": domain.lower() for i, domain in enumerate(query.destinations)}
        params.update(domains)
        where += f" AND domain IN ({', '.join(f':{name}' for name in domains)})"
    return where, params


def count(
    tx: Tx, workspace_id: str, query: Search, moves: Mapping[str, str], now: datetime
) -> Touched:
    """How many emails and recipients `move` would take now (a dry run)."""
    where, params = _matching(workspace_id, query, list(moves), now)
    row = tx.one(
        "SELECT COUNT(*) AS recipients, COUNT(DISTINCT email_id) AS emails"
        f" FROM email_recipients WHERE {where}",
        params,
    )
    assert row is not None
    return Touched(int(row["emails"]), int(row["recipients"]))


def move(
    tx: Tx,
    workspace_id: str,
    query: Search,
    moves: Mapping[str, str],
    due: Due,
    new_window: bool,
    event: tuple[str, dict[str, Any]],
    now: datetime,
    summary: emails.Summary,
) -> tuple[Touched, list[Event]]:
    """Move the matching recipients from each status of `moves` to its target, one UPDATE per
    target; record `event` (type, metadata) for each; summarise their emails by `summary`.
    What it touched, and the events recorded (for the engine's outbox).
    `new_window`: the 72 hours before giving up start again now (`expiry_from`)."""
    where, params = _matching(workspace_id, query, list(moves), now)
    rows = tx.all(f"SELECT email_id, address, domain FROM email_recipients WHERE {where}", params)
    if not rows:
        return Touched(0, 0), []
    by_target: dict[str, list[str]] = {}
    for source, target in moves.items():
        by_target.setdefault(target, []).append(source)
    assign = {
        "now": ", next_attempt_at = :now",
        "keep": "",
        "none": ", next_attempt_at = NULL",
    }[due]
    restart = ", expiry_from = :now" if new_window else ""
    for target, sources in by_target.items():
        only_where, only_params = _matching(workspace_id, query, sources, now)
        tx.execute(
            f"UPDATE email_recipients SET status = :target, updated_at = :now{assign}{restart}"
            f" WHERE {only_where}",
            {**only_params, "target": target},
        )
    event_type, metadata = event
    recorded = emails.insert_events(
        tx,
        (
            Event(
                new_id(), row["email_id"], workspace_id, event_type, row["address"], metadata, now
            )
            for row in rows
        ),
    )
    email_ids = list(dict.fromkeys(row["email_id"] for row in rows))
    for start in range(0, len(email_ids), SUMMARISE_CHUNK):
        emails.summarise(tx, email_ids[start : start + SUMMARISE_CHUNK], now, summary)
    if due == "now":
        for domain in {row["domain"] for row in rows}:
            tx.notify(f"mail:{domain}")
    return Touched(len(email_ids), len(rows)), recorded
