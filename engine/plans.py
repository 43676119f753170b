"""Plan limits and feature gates (docs/architecture.md section 7). -1 means unlimited."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.platform.errors import PlanFeature, PlanLimit
from storage.accounts import hold_workspace
from storage.tx import Tx

UNLIMITED = -1
PLAN_NAMES = ("free", "starter", "pro", "business")


@dataclass(frozen=True, slots=True)
class Plan:
    name: str
    domains: int
    api_keys: int
    batch_size: int  # 0: batch sending not available
    contact_lists: int
    contacts_per_list: int
    templates: int  # 0: templates not available
    smtp_credentials: int
    forwards: int  # 0: forwards not available
    emails_per_month: int
    scheduled_send: bool
    bimi: bool


PLANS: dict[str, Plan] = {
    "free": Plan("free", 1, 2, 0, 1, 1_000, 0, 1, 0, 3_000, False, False),
    "starter": Plan("starter", 3, 5, 25, 10, 10_000, 20, 3, 5, 50_000, True, False),
    "pro": Plan("pro", 10, 15, 50, 50, 100_000, 200, 10, 50, 500_000, True, True),
    "business": Plan(
        "business",
        UNLIMITED,
        50,
        100,
        UNLIMITED,
        1_000_000,
        UNLIMITED,
        UNLIMITED,
        UNLIMITED,
        UNLIMITED,
        True,
        True,
    ),
}


def plan(name: str) -> Plan:
    """The plan called `name`."""
    return PLANS[name]


def check_room(limit: int, used: int, what: str, plan_name: str) -> None:
    """Raise PlanLimit when `used` already fills `limit` (-1 is unlimited)."""
    if limit != UNLIMITED and used >= limit:
        raise PlanLimit(
            f"The {plan_name} plan allows {limit} {what}; upgrade the plan or remove one first.",
            limit=limit,
        )


def check_workspace_room(
    tx: Tx,
    workspace_id: str,
    limit: int,
    count: Callable[[Tx, str], int],
    what: str,
    plan_name: str,
) -> None:
    """Raise PlanLimit when the workspace's `count` of `what` already fills `limit`, in a
    write about to add one: the workspace is held first, so writes adding at once take turns
    and the second counts the first's."""
    if limit == UNLIMITED:
        return
    hold_workspace(tx, workspace_id)
    check_room(limit, count(tx, workspace_id), what, plan_name)


def require(feature_available: bool, feature: str, plan_name: str) -> None:
    """Raise PlanFeature when the plan lacks a feature."""
    if not feature_available:
        raise PlanFeature(f"{feature} is not available on the {plan_name} plan.")
