"""A workspace's unsubscribe footer: read and changed (`/v1/workspace/unsubscribe-footer`),
and the footer delivery adds (engine/mail/unsubscribe_footer.py holds the rules).

Changing it writes `unsubscribe_footer.updated` (Send) in the same unit of work; each wording
must place `{{unsubscribe_url}}` (422 otherwise). Mail queued before a change gets the footer
in force when it is built.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.activity import Change, record
from engine.mail.unsubscribe_footer import DEFAULT, Footer, wording_problem
from engine.platform.errors import Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import unsubscribe_footers
from storage.tx import Tx
from storage.unsubscribe_footers import StoredFooter


@dataclass(frozen=True, slots=True)
class FooterState:
    footer: Footer
    updated_at: datetime | None  # None: never changed (the default)


@dataclass(frozen=True, slots=True)
class FooterChange:
    """The fields a request changes; None leaves one as it is."""

    enabled: bool | None = None
    text: str | None = None
    html: str | None = None


def footer_of(stored: StoredFooter | None) -> Footer:
    """The footer a workspace's mail gets, from what it stored (None: the default)."""
    return DEFAULT if stored is None else Footer(stored.enabled, stored.text, stored.html)


def _state(stored: StoredFooter | None) -> FooterState:
    return FooterState(footer_of(stored), None if stored is None else stored.updated_at)


async def get(rt: Runtime, who: Principal) -> FooterState:
    return _state(await rt.db.read(unsubscribe_footers.get, who.workspace_id))


def _update(tx: Tx, who: Principal, change: FooterChange, now: datetime) -> FooterState:
    current = footer_of(unsubscribe_footers.get(tx, who.workspace_id))
    stored = StoredFooter(
        current.enabled if change.enabled is None else change.enabled,
        current.text if change.text is None else change.text,
        current.html if change.html is None else change.html,
        now,
    )
    unsubscribe_footers.put(tx, who.workspace_id, stored)
    changed = sorted(
        name for name in ("enabled", "text", "html") if getattr(change, name) is not None
    )
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("unsubscribe_footer.updated", "Unsubscribe footer", None, {"changed": changed}),
        now,
    )
    return _state(stored)


async def update(rt: Runtime, who: Principal, change: FooterChange) -> FooterState:
    """Change the workspace's footer; Unprocessable when a wording lacks the link."""
    problems = [
        f"{name} {problem}"
        for name in ("text", "html")
        if (wording := getattr(change, name)) is not None
        and (problem := wording_problem(wording)) is not None
    ]
    if problems:
        errors = [{"loc": ["body", p.split()[0]], "msg": p} for p in problems]
        raise Unprocessable("; ".join(problems), errors=errors)
    return await rt.db.write(_update, who, change, rt.clock.now())
