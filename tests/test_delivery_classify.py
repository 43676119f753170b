"""Every way a delivery attempt can end, and the one verdict `classify` gives it."""

from __future__ import annotations

import pytest

from engine.delivery.classify import (
    DnsFailure,
    NoMailService,
    Outcome,
    PrivateTargets,
    Replied,
    SessionRefused,
    SuppressedSince,
    Unbuildable,
    Unreachable,
    Verdict,
    classify,
)
from engine.smtp.replies import SmtpReply

R = SmtpReply.of
TABLE: list[tuple[Outcome, Verdict, str]] = [
    (Replied(R(250, "2.0.0 OK")), Verdict.DELIVERED, "250 2.0.0 OK"),
    (Replied(R(251, "2.1.5 forwarded")), Verdict.DELIVERED, "251 2.1.5 forwarded"),
    (Replied(R(450, "4.2.0 busy")), Verdict.DEFERRED, "450 4.2.0 busy"),
    (Replied(R(421, "4.3.2 closing")), Verdict.DEFERRED, "421 4.3.2 closing"),
    (Replied(R(452, "4.5.3 too many")), Verdict.DEFERRED, "452 4.5.3 too many"),
    (Replied(R(550, "5.1.1 no such user")), Verdict.BOUNCED, "550 5.1.1 no such user"),
    (Replied(R(552, "5.3.4 too big")), Verdict.BOUNCED, "552 5.3.4 too big"),
    (Replied(R(553, "5.6.7 needs SMTPUTF8")), Verdict.BOUNCED, "553 5.6.7 needs SMTPUTF8"),
    (NoMailService("x.example accepts no mail (null MX)"), Verdict.BOUNCED, "x.example accepts"),
    (DnsFailure("SERVFAIL"), Verdict.DEFERRED, "SERVFAIL"),
    (PrivateTargets("only private addresses"), Verdict.DEFERRED, "only private"),
    (Unreachable("mx [1.2.3.4]: connection refused"), Verdict.DEFERRED, "connection refused"),
    (Unreachable("mx: closing", R(421, "4.7.0 bye")), Verdict.DEFERRED, "mx: closing"),
    (SessionRefused("mx: 554 go away", R(554, "5.3.2 go away")), Verdict.REFUSED, "554 go"),
    (Unbuildable("the sending domain was deleted"), Verdict.FAILED, "domain was deleted"),
    (SuppressedSince("complaint"), Verdict.FAILED, "suppressed (complaint) after the email"),
]


@pytest.mark.parametrize(("outcome", "verdict", "response"), TABLE)
def test_each_outcome_has_one_verdict(outcome: Outcome, verdict: Verdict, response: str) -> None:
    decision = classify(outcome)
    assert decision.verdict is verdict
    assert response in decision.response


def test_every_kind_of_outcome_is_in_the_table() -> None:
    kinds = {type(outcome) for outcome, _, _ in TABLE}
    assert kinds == set(Outcome.__args__)


def test_something_else_is_not_an_outcome() -> None:
    with pytest.raises(TypeError):
        classify("550 5.1.1 no such user")  # type: ignore[arg-type]
