"""Reads and writes of the delivery path that span emails, domains and suppressions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from storage import domains, emails, suppressions
from storage.domains import Domain
from storage.emails import Email, Event, RecipientUpdate, Unreadable
from storage.suppressions import Suppression
from storage.tx import Tx


def emails_with_domains(
    tx: Tx, email_ids: Sequence[str]
) -> tuple[list[tuple[Email, Domain | None]], dict[str, Unreadable]]:
    """The emails to deliver, each with its sending domain (for DKIM; None if deleted since);
    and apart, those whose stored row cannot be read."""
    found, unreadable = emails.readable_by_ids(tx, email_ids)
    pairs = [
        (email, domains.get(tx, email.workspace_id, email.domain_id))
        for email in emails.with_raw(tx, found).values()
    ]
    return pairs, unreadable


def suppressed_since_accepted(tx: Tx, email: Email, addresses: Sequence[str]) -> dict[str, str]:
    """Which of an email's recipients were suppressed after it was accepted, with the reason.

    Those must not be sent to any more (a scheduled email, or one waiting to retry).
    Suppressions older than the email were dealt with when it was accepted.
    """
    late: dict[str, str] = {}
    for address in addresses:
        entry = suppressions.get(tx, email.workspace_id, address)
        if entry is not None and entry.created_at > email.created_at:
            late[address] = entry.reason
    return late


def record_outcomes(
    tx: Tx,
    updates: Sequence[RecipientUpdate],
    events: Sequence[Event],
    hard_bounces: Sequence[tuple[str, Suppression]],
    now: datetime,
) -> None:
    """One batched write per delivery round: outcomes, events and new suppressions."""
    emails.record_attempts(tx, updates, events, now)
    for workspace_id, entry in hard_bounces:
        suppressions.add(tx, workspace_id, entry)
