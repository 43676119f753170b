"""The transfer state machine's pure rules: the table, deadlines, refusals, the rate limit."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from engine.transfers import rules
from engine.transfers.rules import Trigger

NOW = datetime(2026, 11, 22, 12, 0, tzinfo=UTC)
LATER = NOW + timedelta(days=1)


def test_the_table_is_the_spec_state_table() -> None:
    assert rules.next_state(None, Trigger.INITIATE) == rules.PENDING
    assert rules.next_state(rules.PENDING, Trigger.ACCEPT) == rules.ACCEPTED
    assert rules.next_state(rules.PENDING, Trigger.DECLINE) == rules.DECLINED
    assert rules.next_state(rules.PENDING, Trigger.CANCEL) == rules.CANCELLED
    assert rules.next_state(rules.PENDING, Trigger.EXPIRE) == rules.EXPIRED
    assert rules.next_state(rules.ACCEPTED, Trigger.STOP) == rules.REVERSED
    assert rules.next_state(rules.ACCEPTED, Trigger.WINDOW_ENDS) == rules.COMPLETED
    assert rules.next_state(None, Trigger.FORCE) == rules.COMPLETED


@pytest.mark.parametrize("state", rules.STATES)
def test_final_states_have_no_way_out(state: str) -> None:
    allowed = {trigger for (source, trigger) in rules.TRANSITIONS if source == state}
    if state in (rules.PENDING, rules.ACCEPTED):
        assert allowed
    else:
        assert allowed == set()


def test_cancel_after_acceptance_is_not_pending() -> None:
    refusal = rules.pending_refusal(Trigger.CANCEL, rules.ACCEPTED, LATER, NOW)
    assert refusal is not None and refusal.code == "not_pending"
    assert rules.pending_refusal(Trigger.CANCEL, rules.PENDING, LATER, NOW) is None


def test_a_pending_transfer_past_its_expiry_is_expired_before_the_timer_runs() -> None:
    assert rules.effective_status(rules.PENDING, NOW, None, NOW) == rules.EXPIRED
    assert rules.effective_status(rules.PENDING, LATER, None, NOW) == rules.PENDING


def _accept(**overrides: object) -> rules.Refusal | None:
    facts: dict[str, object] = {
        "is_recipient": True,
        "in_workspace": True,
        "domains_in_workspace": 0,
        "domain_limit": 1,
    }
    facts.update(overrides)
    status = str(facts.pop("status", rules.PENDING))
    expires = facts.pop("expires_at", LATER)
    assert isinstance(expires, datetime)
    return rules.accept_refusal(status, expires, NOW, **facts)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "kind", "code"),
    [
        ({"is_recipient": False}, "forbidden", "wrong_recipient"),
        ({"expires_at": NOW}, "gone", "expired"),
        ({"status": rules.EXPIRED}, "gone", "expired"),
        ({"status": rules.DECLINED}, "conflict", "not_pending"),
        ({"status": rules.ACCEPTED}, "conflict", "not_pending"),
        ({"in_workspace": False}, "forbidden", "org_access_lost"),
        ({"domains_in_workspace": 1}, "forbidden", "domain_limit"),
    ],
)
def test_accept_refusals(overrides: dict[str, object], kind: str, code: str) -> None:
    refusal = _accept(**overrides)
    assert refusal is not None
    assert (refusal.kind, refusal.code) == (kind, code)


def test_accept_is_allowed_within_the_limit_and_when_unlimited() -> None:
    assert _accept() is None
    assert _accept(domains_in_workspace=500, domain_limit=-1) is None


def test_stop_only_inside_the_window() -> None:
    assert rules.stop_refusal(rules.ACCEPTED, LATER, LATER, NOW) is None
    over = rules.stop_refusal(rules.ACCEPTED, LATER, NOW, NOW)
    assert over is not None and over.code == "not_stoppable"
    done = rules.stop_refusal(rules.COMPLETED, LATER, None, NOW)
    assert done is not None and done.code == "not_stoppable"


def _facts(**overrides: object) -> rules.InitiateFacts:
    values: dict[str, object] = {
        "active_transfer": False,
        "broadcasts_in_flight": [],
        "scheduled_emails": 0,
        "target_exists": True,
        "target_is_self": False,
    }
    values.update(overrides)
    return rules.InitiateFacts(**values)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("overrides", "code"),
    [
        ({"active_transfer": True}, "transfer_active"),
        ({"broadcasts_in_flight": ["b"]}, "broadcasts_in_flight"),
        ({"scheduled_emails": 2}, "scheduled_emails"),
        ({"target_exists": False}, "target_not_found"),
        ({"target_is_self": True}, "self_transfer"),
    ],
)
def test_initiate_preconditions(overrides: dict[str, object], code: str) -> None:
    refusal = rules.initiate_refusal(_facts(**overrides))
    assert refusal is not None and refusal.code == code
    assert rules.initiate_refusal(_facts()) is None


def test_five_initiations_per_minute_then_wait_for_the_oldest_to_age_out() -> None:
    attempts = [NOW - timedelta(seconds=s) for s in (50, 40, 30, 20)]
    assert rules.retry_after(attempts, NOW) is None
    attempts.append(NOW - timedelta(seconds=10))
    assert rules.retry_after(attempts, NOW) == 10  # the one 50 s ago frees a slot in 10 s
    assert rules.retry_after(attempts, NOW + timedelta(seconds=11)) is None
