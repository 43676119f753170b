"""Reads and writes of the delivery path that span emails, domains and suppressions."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from storage import domains, emails, suppressions
from storage.domains import Domain
from storage.emails import Email, Event, RecipientUpdate
from storage.suppressions import Suppression
from storage.tx import Tx


def emails_with_domains(tx: Tx, email_ids: Sequence[str]) -> list[tuple[Email, Domain]]:
    """The emails to deliver, each with its sending domain (for DKIM); missing ones skipped."""
    pairs = []
    for email in emails.by_ids(tx, email_ids).values():
        domain = domains.get(tx, email.workspace_id, email.domain_id)
        if domain is not None:
            pairs.append((email, domain))
    return pairs


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
