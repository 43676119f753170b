"""What each verdict records (engine/delivery/outcomes.py), from plain data: the events in
order, the status move and its next attempt, the suppression, the destination incident, the
mailbox-full mark; and how the router's routes split a round between egresses
(engine/delivery/egress.py)."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import trio
import trio.testing

from engine.delivery import outcomes
from engine.delivery.classify import (
    DnsFailure,
    Outcome,
    Replied,
    SessionRefused,
    SuppressedSince,
    Unbuildable,
    Unreachable,
    classify,
)
from engine.delivery.domain_queue import _Round
from engine.delivery.egress import Lanes, Record, Routes, Transfer
from engine.delivery.messages import WireMessage
from engine.delivery.retry import GIVE_UP_AFTER
from engine.sending import statuses
from engine.smtp.replies import SmtpReply
from storage.emails import Email, Recipient
from storage.incidents import Hit

R = SmtpReply.of
NOW = datetime(2026, 3, 2, 12, 0, tzinfo=UTC)
EMAIL = Email(
    id="em_1",
    workspace_id="ws_1",
    domain_id="dom_1",
    from_address="news@Sender.Example",
    from_name=None,
    to=[],
    cc=[],
    bcc=[],
    reply_to=None,
    subject="Issue 1",
    html=None,
    text="Hello.",
    headers={},
    tags=["news"],
    attachments=[],
    status="queued",
    source="api",
    message_id="<1@sender.example>",
    rejection_reason=None,
    retry_of_id=None,
    send_at=None,
    created_at=NOW - timedelta(minutes=5),
    updated_at=NOW - timedelta(minutes=5),
    delivered_at=None,
)


def recipient(status: str = statuses.QUEUED, queued: timedelta = timedelta(minutes=5)) -> Recipient:
    return Recipient(
        email_id=EMAIL.id,
        address="reader@dest.example",
        kind="to",
        domain="dest.example",
        status=status,
        attempts=0,
        next_attempt_at=None,
        last_response=None,
        queued_at=NOW - queued,
    )


def effects_of(outcome: Outcome, to: Recipient | None = None) -> outcomes.Effects:
    return outcomes.effects(EMAIL, to or recipient(), classify(outcome), NOW)


def test_a_delivery_is_sent_then_delivered_with_the_server_that_took_it() -> None:
    via = {"mx_host": "mx.dest.example", "tls": "TLSv1.3"}
    done = outcomes.effects(EMAIL, recipient(), classify(Replied(R(250, "2.0.0 OK"))), NOW, via=via)
    assert [kind for kind, _ in done.events] == ["sent", "delivered"]
    delivered = done.events[1][1]
    assert delivered["mx_host"] == "mx.dest.example" and delivered["tls"] == "TLSv1.3"
    assert delivered["subject"] == "Issue 1" and delivered["tags"] == ["news"]
    assert delivered["smtp_response"] == "250 2.0.0 OK"
    assert done.update.status == statuses.DELIVERED and done.update.next_attempt_at is None
    assert done.delivered and done.suppression is None and done.incident is None


def test_a_hard_bounce_suppresses_the_address_and_a_refused_session_does_not() -> None:
    bounced = effects_of(Replied(R(550, "5.1.1 no such user")))
    assert [kind for kind, _ in bounced.events] == ["bounced"]
    assert bounced.update.status == statuses.BOUNCED
    assert bounced.suppression is not None
    assert bounced.suppression.email == "reader@dest.example"
    assert bounced.suppression.reason == "hard_bounce" and bounced.suppression.created_at == NOW

    refused = effects_of(SessionRefused("mx: 554 go away", R(554, "5.3.2 go away")))
    assert refused.update.status == statuses.BOUNCED and refused.suppression is None
    assert refused.events[0][1]["blame"] == "destination"


def test_a_refused_message_fails_without_a_suppression() -> None:
    done = effects_of(Replied(R(552, "5.3.4 too big")))
    assert [kind for kind, _ in done.events] == ["failed"]
    assert done.update.status == statuses.FAILED and done.suppression is None


def test_a_deferral_is_tried_again_later_with_its_tls_policy() -> None:
    facts = {"policy": "mta-sts", "reason": "tls_policy"}
    decision = classify(Unreachable("tls_policy: no TLS", policy="mta-sts", tls_policy=True))
    done = outcomes.effects(EMAIL, recipient(), decision, NOW, facts=facts)
    assert done.update.status == statuses.DEFERRED
    assert done.update.next_attempt_at is not None and done.update.next_attempt_at > NOW
    kind, meta = done.events[0]
    assert kind == "deferred" and meta["policy"] == "mta-sts" and meta["reason"] == "tls_policy"
    assert meta["next_attempt_at"] == done.update.next_attempt_at.isoformat()
    assert done.incident is None and not done.mailbox_full


def test_a_sending_side_problem_opens_an_incident_for_the_sending_domain() -> None:
    done = effects_of(DnsFailure("SERVFAIL"))
    assert done.update.status == statuses.DEFERRED
    assert done.incident == Hit("dns", "sender.example", classify(DnsFailure("SERVFAIL")).response)
    assert done.events[0][1]["incident"] == "dns"


def test_a_full_mailbox_is_marked_and_deferred() -> None:
    done = effects_of(Replied(R(552, "5.2.2 mailbox full")))
    assert done.mailbox_full and done.update.status == statuses.DEFERRED
    kind, meta = done.events[-1]
    assert kind == "deferred" and meta["bounce_type"] == "soft" and meta["dsn"] == "5.2.2"


def test_72_hours_of_deferrals_give_up() -> None:
    late = recipient(statuses.DEFERRED, queued=GIVE_UP_AFTER + timedelta(minutes=1))
    done = effects_of(Unreachable("mx [1.2.3.4]: connection refused"), late)
    assert done.update.status == statuses.FAILED and done.update.next_attempt_at is None
    assert done.events[0][0] == "failed"
    assert done.events[0][1]["error"].startswith("gave up after 72 hours")


def test_an_unbuildable_or_late_suppressed_message_fails() -> None:
    for outcome in (Unbuildable("the sending domain was deleted"), SuppressedSince("complaint")):
        done = effects_of(outcome)
        assert [kind for kind, _ in done.events] == ["failed"]
        assert done.update.status == statuses.FAILED


def test_an_unreadable_email_fails_with_only_the_error() -> None:
    error = "the stored email cannot be read"
    done = outcomes.unreadable(recipient(), classify(Unbuildable(error)), error)
    assert done.events == (("failed", {"error": error}),)
    assert done.update.status == statuses.FAILED and done.update.email_id == EMAIL.id


def _transfer(workspace: str) -> Transfer:
    email = replace(EMAIL, workspace_id=workspace)
    message = WireMessage(EMAIL.id, "news@sender.example", b"Subject: x\r\n\r\nx\r\n")
    return Transfer(email, [recipient()], message)


class _Taking:
    """An egress taking the transfers of one workspace, noting what it was sent."""

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.asked: list[int] = []

    async def select(self, transfers: list[Transfer]) -> list[Transfer]:
        self.asked.append(len(transfers))
        return [t for t in transfers if t.email.workspace_id == self.workspace]

    async def takes(self, email_ids: Collection[str]) -> set[str]:
        return {i for i in email_ids if i.startswith(self.workspace)}

    async def send(self, transfers: list[Transfer], record: Record, lanes: Lanes) -> None:
        raise AssertionError("routing sends nothing")


def _workspaces(batch: Sequence[Transfer]) -> list[str]:
    return [t.email.workspace_id for t in batch]


def test_routes_give_each_transfer_to_the_first_egress_that_takes_it() -> None:
    sandbox, other, default = _Taking("ws_sandbox"), _Taking("ws_other"), _Taking("-")
    work = [_transfer(w) for w in ("ws_1", "ws_sandbox", "ws_2", "ws_sandbox")]
    batches = trio.run(Routes([sandbox, other]).route, work, default)
    assert [(egress, _workspaces(batch)) for egress, batch in batches] == [
        (sandbox, ["ws_sandbox", "ws_sandbox"]),
        (default, ["ws_1", "ws_2"]),
    ]
    assert sandbox.asked == [4] and other.asked == [2]  # each sees what is left


def test_routes_know_when_a_rounds_emails_all_go_elsewhere() -> None:
    """(Here an email's id begins with its workspace's.) Mail that selective egresses take
    whole needs no network: its destination's MX is not looked up."""
    routes = Routes([_Taking("ws_sandbox"), _Taking("ws_other")])
    assert trio.run(routes.all_elsewhere, {"ws_sandbox:1", "ws_other:2"})
    assert not trio.run(routes.all_elsewhere, {"ws_sandbox:1", "ws_live:3"})
    assert trio.run(routes.all_elsewhere, set())  # nothing due asks nothing either
    assert not trio.run(Routes().all_elsewhere, {"ws_sandbox:1"})


def test_routes_without_selective_egresses_send_everything_to_the_default() -> None:
    default = _Taking("-")
    work = [_transfer("ws_1")]
    assert trio.run(Routes().route, work, default) == [(default, work)]
    everything = _Taking("ws_1")
    assert trio.run(Routes([everything]).route, work, default) == [(everything, work)]


def test_outcomes_count_as_recorded_only_up_to_the_earliest_write_under_way() -> None:
    """Two writes of a round's outcomes at once (PostgreSQL's two writers) may end in either
    order: a connection whose transaction's outcome the first write holds must not send its
    next message because the second one ended first."""

    async def main() -> None:
        round_ = _Round(NOW, 2)
        ok = Replied(R(250, "2.0.0 OK"))
        round_.settle(EMAIL, recipient(), ok)
        first = round_.hand()
        assert round_.take() is not None
        round_.settle(EMAIL, replace(recipient(), address="other@dest.example"), ok)
        second = round_.hand()
        assert round_.take() is not None
        progress: list[int] = []

        async def connection(upto: int) -> None:
            await round_.recorded(upto)
            progress.append(upto)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(connection, 1)
            nursery.start_soon(connection, 2)
            await trio.testing.wait_all_tasks_blocked()
            round_.done_with(second)
            await trio.testing.wait_all_tasks_blocked()
            assert progress == []  # the earlier write is still under way
            round_.done_with(first)
        assert sorted(progress) == [1, 2]
        assert round_.taken == 2

    trio.run(main)
