"""A user's workspaces, and how much of its plan a workspace uses (the console's account page).

Usage is counted as the plan checks count it when a resource is created (engine/plans.py):
active API keys and SMTP credentials, domains, contact lists, templates, forwards, and the
emails of this calendar month (UTC).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine import plans
from engine.platform.runtime import Principal, Runtime
from storage import (
    accounts,
    api_keys,
    contacts,
    domains,
    emails,
    forwards,
    sandbox,
    smtp_credentials,
    templates,
)
from storage.accounts import Workspace
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class WorkspaceView:
    workspace: Workspace
    sandboxed: bool


@dataclass(frozen=True, slots=True)
class Allowance:
    what: str
    used: int
    limit: int  # plans.UNLIMITED (-1), or 0: not on this plan


def _workspaces(tx: Tx, user_id: str) -> list[WorkspaceView]:
    return [
        WorkspaceView(w, sandbox.is_sandboxed(tx, w.id))
        for w in accounts.workspaces_of(tx, user_id)
    ]


async def workspaces_of(rt: Runtime, who: Principal) -> list[WorkspaceView]:
    """The caller's workspaces, oldest first, each with its sandbox mode."""
    return await rt.db.read(_workspaces, who.user_id)


def _usage(tx: Tx, who: Principal, month: str) -> list[Allowance]:
    plan = plans.plan(who.plan)
    ws = who.workspace_id
    return [
        Allowance("emails this month", emails.sent_in_month(tx, ws, month), plan.emails_per_month),
        Allowance("domains", domains.count(tx, ws), plan.domains),
        Allowance("API keys", api_keys.count_active(tx, ws), plan.api_keys),
        Allowance("SMTP credentials", smtp_credentials.count_active(tx, ws), plan.smtp_credentials),
        Allowance("contact lists", contacts.count_lists(tx, ws), plan.contact_lists),
        Allowance("templates", templates.count(tx, ws), plan.templates),
        Allowance("forwards", forwards.count(tx, ws), plan.forwards),
    ]


async def usage(rt: Runtime, who: Principal) -> list[Allowance]:
    """What the workspace uses of each limit of its plan."""
    return await rt.db.read(_usage, who, rt.clock.now().strftime("%Y-%m"))
