"""The email and recipient status tables (engine/sending/statuses.py) against the contract
(docs/architecture.md section 7)."""

from __future__ import annotations

import pytest

from engine.sending import statuses
from engine.sending.statuses import Trigger
from storage.emails import Move


def test_email_moves_are_the_documented_ones_and_nothing_else() -> None:
    allowed = {
        (None, Trigger.ACCEPT): "queued",
        (None, Trigger.ACCEPT_SCHEDULED): "scheduled",
        (None, Trigger.ACCEPT_SUPPRESSED): "rejected",
        ("scheduled", Trigger.SEND_NOW): "queued",
        ("scheduled", Trigger.SEND_NOW_SUPPRESSED): "rejected",
        ("scheduled", Trigger.CANCEL): "cancelled",
    }
    for current in (None, *statuses.EMAIL_STATUSES):
        for trigger in Trigger:
            if (current, trigger) in allowed:
                assert statuses.email_next(current, trigger) == allowed[(current, trigger)]
            else:
                with pytest.raises(ValueError):
                    statuses.email_next(current, trigger)


def test_recipients_move_only_from_waiting_except_a_late_bounce() -> None:
    assert statuses.recipient_next("queued", Trigger.ACCEPTED_BY_MX) == "delivered"
    assert statuses.recipient_next("deferred", Trigger.TEMPORARY) == "deferred"
    assert statuses.recipient_next("queued", Trigger.PERMANENT) == "bounced"
    assert statuses.recipient_next("deferred", Trigger.GAVE_UP) == "failed"
    assert statuses.recipient_next("delivered", Trigger.PERMANENT) == "bounced"  # a late DSN
    for final in ("bounced", "failed", "cancelled"):
        for trigger in Trigger:
            with pytest.raises(ValueError):
                statuses.recipient_next(final, trigger)
    with pytest.raises(ValueError):
        statuses.recipient_next("delivered", Trigger.TEMPORARY)


@pytest.mark.parametrize(
    ("recipients", "email"),
    [
        (["delivered", "queued"], "queued"),
        (["delivered", "sending"], "queued"),
        (["bounced", "deferred", "delivered"], "deferred"),
        (["bounced", "delivered"], "delivered"),
        (["failed", "bounced"], "bounced"),
        (["failed"], "failed"),
        (["cancelled", "failed"], "failed"),
        (["cancelled"], "cancelled"),  # every recipient cancelled by a queue action
        (["held", "deferred"], "deferred"),
        (["held", "delivered"], "held"),  # not done while a recipient waits for a release
    ],
)
def test_an_email_summarises_its_recipients(recipients: list[str], email: str) -> None:
    assert statuses.summary(recipients) == email


def test_held_recipients_are_released_to_queued_or_cancelled_and_nothing_else() -> None:
    for waiting in ("queued", "deferred"):
        assert statuses.recipient_next(waiting, Trigger.HOLD) == "held"
        assert statuses.recipient_next(waiting, Trigger.RETRY_NOW) == waiting
        with pytest.raises(ValueError):
            statuses.recipient_next(waiting, Trigger.RELEASE)
    allowed = {Trigger.RELEASE: "queued", Trigger.CANCEL: "cancelled"}
    for trigger in Trigger:
        if trigger in allowed:
            assert statuses.recipient_next("held", trigger) == allowed[trigger]
        else:
            with pytest.raises(ValueError):
                statuses.recipient_next("held", trigger)


def test_retry_is_allowed_from_the_documented_statuses_only() -> None:
    assert set(statuses.RETRYABLE) == {"bounced", "rejected", "failed"}


def test_storage_is_handed_moves_from_the_tables() -> None:
    # Storage carries out moves and never picks statuses: what it gets comes from the tables.
    assert statuses.email_move("scheduled", Trigger.CANCEL) == Move(("scheduled",), "cancelled")
    assert statuses.recipients_move(Trigger.GAVE_UP) == Move(("queued", "deferred"), "failed")
    assert statuses.recipients_move(Trigger.CANCEL, ("held",)) == Move(("held",), "cancelled")
    with pytest.raises(ValueError):
        statuses.email_move("queued", Trigger.CANCEL)  # only a scheduled email is cancelled
    with pytest.raises(ValueError):
        statuses.recipients_move(Trigger.RELEASE)  # only held recipients are released
    with pytest.raises(ValueError):
        statuses.recipients_move(Trigger.RETRY_NOW)  # each stays as it is: no one target
