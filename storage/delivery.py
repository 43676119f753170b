"""Reads and writes of the delivery path that span emails, domains and suppressions.

Set-based: a delivery round is loaded and recorded with a fixed number of statements
whatever its size (load: one query each for emails, their submitted messages, sending
domains, suppressions and unsubscribe footers; record: one UPDATE per distinct outcome, the
events, one UPDATE per resulting email status, and one SELECT of the recipients of the emails
the write does not hold every recipient of; plus one insert per new hard bounce), never a
query per email or per recipient. The claim is storage/emails.py's (one
SELECT, one batched UPDATE, one MIN).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from storage import domains, emails, suppressions, unsubscribe_footers
from storage.codec import in_list, parse_timestamp, timestamp
from storage.domains import Domain
from storage.emails import Email, Event, Recipient, RecipientUpdate, Unreadable
from storage.suppressions import Suppression
from storage.tx import Tx
from storage.unsubscribe_footers import StoredFooter


def _pairs(prefix: str, keys: Sequence[tuple[str, str]]) -> tuple[str, dict[str, Any]]:
    """`(:a0, :b0), (:a1, :b1), ...` for a row-value IN list of (email_id, address) keys."""
    params: dict[str, Any] = {}
    rows = []
    for i, (email_id, address) in enumerate(keys):
        params[f"{prefix}e{i}"], params[f"{prefix}a{i}"] = email_id, address
        rows.append(f"(:{prefix}e{i}, :{prefix}a{i})")
    return ", ".join(rows), params


@dataclass(frozen=True, slots=True)
class Unheld:
    """Which outcomes are written over recipients their writer no longer holds, when no
    node does (the engine's rule, engine/sending/statuses.py `UNHELD`): those moving a recipient still
    waiting in one of `from_` to one of `to`. Storage carries it out, never picks it."""

    from_: tuple[str, ...]
    to: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RoundData:
    """What a delivery round needs of the database, loaded in one unit of work.

    `emails`: each readable email with its sending domain (None when deleted since) and
    those of its recipients that were suppressed after it was accepted (address -> reason);
    `unreadable`: the emails whose stored row cannot be read; `footers`: the unsubscribe
    footers stored by the workspaces of the emails that offer unsubscribe.
    """

    emails: list[tuple[Email, Domain | None, dict[str, str]]]
    unreadable: dict[str, Unreadable]
    large: dict[str, int]  # emails whose submitted message was left out: its size
    footers: dict[str, StoredFooter] = field(default_factory=dict)


def load_round(
    tx: Tx, recipients: Sequence[Recipient], larger_than: int | None = None
) -> RoundData:
    """The emails of a round's recipients, with their domains and late suppressions;
    submitted messages of more than `larger_than` octets are left out (`RoundData.large`)."""
    email_ids = list(dict.fromkeys(r.email_id for r in recipients))
    found, unreadable = emails.readable_by_ids(tx, email_ids)
    found, large = emails.with_raw(tx, found, larger_than)
    sending = _domains(tx, {(e.workspace_id, e.domain_id) for e in found.values()})
    late = _suppressed_since_accepted(tx, found, recipients)
    footers = unsubscribe_footers.of_workspaces(
        tx, (e.workspace_id for e in found.values() if e.unsubscribe)
    )
    return RoundData(
        [
            (email, sending.get((email.workspace_id, email.domain_id)), late.get(email.id, {}))
            for email in found.values()
        ],
        unreadable,
        large,
        footers,
    )


def _domains(tx: Tx, keys: set[tuple[str, str]]) -> dict[tuple[str, str], Domain]:
    if not keys:
        return {}
    ids, params = in_list("d", sorted({domain_id for _, domain_id in keys}))
    rows = tx.all(f"SELECT * FROM domains WHERE id IN ({ids})", params)
    # The workspace must match too: a domain id of another workspace is not the email's.
    return {
        (row["workspace_id"], row["id"]): domains._domain(tx, row)
        for row in rows
        if (row["workspace_id"], row["id"]) in keys
    }


def _suppressed_since_accepted(
    tx: Tx, found: dict[str, Email], recipients: Sequence[Recipient]
) -> dict[str, dict[str, str]]:
    """Per email, which of its recipients were suppressed after it was accepted, with the
    reason. Those must not be sent to any more (a scheduled email, or one waiting to
    retry); suppressions older than the email were dealt with when it was accepted."""
    wanted = {
        (found[r.email_id].workspace_id, r.address) for r in recipients if r.email_id in found
    }
    if not wanted:
        return {}
    workspaces, ws_params = in_list("w", sorted({ws for ws, _ in wanted}))
    addresses, address_params = in_list("a", sorted({a for _, a in wanted}))
    rows = tx.all(
        "SELECT workspace_id, email, reason, created_at FROM suppressions"
        f" WHERE workspace_id IN ({workspaces}) AND email IN ({addresses})",
        {**ws_params, **address_params},
    )
    entries = {(row["workspace_id"], row["email"]): row for row in rows}
    late: dict[str, dict[str, str]] = defaultdict(dict)
    for r in recipients:
        email = found.get(r.email_id)
        if email is None:
            continue
        entry = entries.get((email.workspace_id, r.address))
        if entry is not None and parse_timestamp(entry["created_at"]) > email.created_at:
            late[r.email_id][r.address] = entry["reason"]
    return late


def record_outcomes(
    tx: Tx,
    updates: Sequence[RecipientUpdate],
    events: Sequence[Event],
    hard_bounces: Sequence[tuple[str, Suppression]],
    now: datetime,
    summary: emails.Summary,
    holder: str | None = None,
    unheld: Unheld | None = None,
) -> list[Event]:
    """One batched write of delivery outcomes: outcomes, events and new suppressions; the
    emails' statuses summarised by the engine's rule `summary`. The events written, for the
    engine to queue their webhook deliveries in the same transaction. With `holder`, only the recipients that node still holds
    are written: one whose lease was freed (the node was declared dead) is another node's now,
    and a late outcome must not overwrite what that node found; with `unheld` too, the
    outcomes that rule allows over recipients no node holds are written as well."""
    fenced = holder is not None and unheld is None  # fenced by the UPDATE itself
    if holder is not None and unheld is not None:
        ours = writable(tx, updates, holder, unheld)
        updates = [u for u in updates if (u.email_id, u.address) in ours]
    # Most recipients of a round share their outcome ("250 2.0.0 OK"): one UPDATE each.
    alike: dict[tuple[str, str | None, str | None], list[tuple[str, str]]] = defaultdict(list)
    for u in updates:
        when = None if u.next_attempt_at is None else timestamp(u.next_attempt_at)
        alike[(u.status, when, u.last_response)].append((u.email_id, u.address))
    # Fenced, the UPDATE touches only the rows `holder` still holds (and locks them until the
    # transaction ends, so a node reaping `holder` waits for this write) and says which:
    # one statement per outcome, where a SELECT ... FOR UPDATE first made two (the outcomes
    # are written per SMTP transaction, so statements per write are the delivery's cost).
    # It also says how many recipients each email has: an email whose every recipient this
    # write holds is summed up from what it wrote, without reading them back.
    written: set[tuple[str, str]] = set()
    wrote: dict[str, list[str]] = defaultdict(list)  # email id -> the statuses written
    recipients_of: dict[str, int] = {}
    for (status, when, response), keys in alike.items():
        rows, params = _pairs("k", keys)
        sql = (
            "UPDATE email_recipients SET status = :status, attempts = attempts + 1,"
            " next_attempt_at = :next, last_response = :response, lease_until = NULL,"
            f" leased_by = NULL, updated_at = :now WHERE (email_id, address) IN ({rows})"
        )
        values = {"status": status, "next": when, "response": response, "now": timestamp(now)}
        if fenced:
            sql += (
                " AND leased_by = :holder RETURNING email_id, address, (SELECT COUNT(*) FROM"
                " email_recipients o WHERE o.email_id = email_recipients.email_id) AS recipients"
            )
            found = tx.all(sql, values | params | {"holder": holder})
            for row in found:
                written.add((row["email_id"], row["address"]))
                wrote[row["email_id"]].append(status)
                recipients_of[row["email_id"]] = row["recipients"]
        else:
            tx.run(sql, values | params)
    if holder is not None:
        ours = written if fenced else {(u.email_id, u.address) for u in updates}
        updates = [u for u in updates if (u.email_id, u.address) in ours]
        events = [e for e in events if (e.email_id, e.recipient or "") in ours]
        hard_bounces = [
            (workspace_id, entry)
            for workspace_id, entry in hard_bounces
            if (entry.source_email_id or "", entry.email) in ours
        ]
    recorded = emails.insert_events(tx, events)
    whole = {e: found for e, found in wrote.items() if len(found) == recipients_of[e]}
    emails.summarise(tx, [u.email_id for u in updates], now, summary, whole)
    for workspace_id, entry in hard_bounces:
        suppressions.add(tx, workspace_id, entry)
    return recorded


def writable(
    tx: Tx, updates: Sequence[RecipientUpdate], holder: str, unheld: Unheld
) -> set[tuple[str, str]]:
    """The (email id, address) of the outcomes `record_outcomes` writes with `holder` and
    `unheld`: of recipients `holder` still holds, and those `unheld` allows over recipients
    no node holds (locked until the transaction ends)."""
    held, free = _still_held(tx, [(u.email_id, u.address) for u in updates], holder, unheld)
    return held | {(u.email_id, u.address) for u in updates if u.status in unheld.to} & free


def _still_held(
    tx: Tx, keys: Sequence[tuple[str, str]], holder: str, unheld: Unheld
) -> tuple[set[tuple[str, str]], set[tuple[str, str]]]:
    """Those of `keys` (email id, address) whose lease `holder` holds, and those no node holds
    that wait in one of `unheld.from_`; locked until the transaction ends, so that a node
    reaping `holder` or claiming them meanwhile waits for this write."""
    if not keys:
        return set(), set()
    rows, params = _pairs("h", keys)
    lock = tx.row_lock()
    waiting, waiting_params = in_list("u", unheld.from_)
    holders = f"(leased_by = :holder OR (leased_by IS NULL AND status IN ({waiting})))"
    params |= waiting_params
    found = tx.all(
        "SELECT email_id, address, leased_by FROM email_recipients"
        f" WHERE (email_id, address) IN ({rows}) AND {holders}{lock}",
        {"holder": holder} | params,
    )
    held = {(row["email_id"], row["address"]) for row in found if row["leased_by"] == holder}
    free = {(row["email_id"], row["address"]) for row in found if row["leased_by"] is None}
    return held, free
