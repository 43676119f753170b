"""What happened to a recipient in a delivery attempt, and what it means: one pure function.

The delivery path turns everything that can end an attempt into a small tree of typed
outcomes (the server's reply, DNS, the connection, TLS, our own private-target rule, a
message that cannot be built, a late suppression), and `classify` decides each one's fate
from a table (DESIGN.md section 3, docs/decisions.md):

| outcome | verdict |
|---|---|
| 2xx reply | delivered |
| 4xx reply, no answer, a broken connection, DNS not answering | deferred (retry schedule) |
| 5xx reply to the recipient or its message | bounced, the address suppressed |
| null MX, or neither MX nor address records | bounced, the address suppressed |
| every MX host refused the session for good (5xx greeting, EHLO and HELO refused) | refused: bounced, never suppressed |
| MX hosts only on private addresses (our rule) | deferred, never suppressed |
| a message that cannot be built, a recipient suppressed since | failed, never sent |

`REFUSED` is the kind for "the destination refused us, not the recipient": what a
`PermanentFailure` of the session says. Classifying policy blocks (5.7.x) and rate limits
(4.7.x) as such destination incidents can be added here without touching the queue.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from engine.smtp.replies import SmtpReply


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    DEFERRED = "deferred"  # tried again on the retry schedule; failed 72 h after queueing
    BOUNCED = "bounced"  # the recipient cannot receive mail: bounced and suppressed
    REFUSED = "refused"  # the destination refused us, not the recipient: bounced, not suppressed
    FAILED = "failed"  # never sent and never will be: our data, or a suppression since


@dataclass(frozen=True, slots=True)
class Replied:
    """The server's reply that decides the recipient (RCPT, else DATA's, else MAIL's)."""

    reply: SmtpReply


@dataclass(frozen=True, slots=True)
class NoMailService:
    """The domain publishes a null MX, or has neither MX nor address records."""

    detail: str


@dataclass(frozen=True, slots=True)
class DnsFailure:
    """DNS could not answer for the domain or its MX hosts."""

    detail: str


@dataclass(frozen=True, slots=True)
class PrivateTargets:
    """Every address of the domain's mail hosts is one our private-network rule refuses."""

    detail: str


@dataclass(frozen=True, slots=True)
class Unreachable:
    """No MX host could be reached or kept talking: refused or timed-out connections, a 4xx
    or 421 from the server, a failed TLS handshake (after the plain-text retry), a broken
    connection or protocol; `reply` is the server's, when it gave one."""

    detail: str
    reply: SmtpReply | None = None


@dataclass(frozen=True, slots=True)
class SessionRefused:
    """Every MX host that answered refused the session for good (`PermanentFailure`)."""

    detail: str
    reply: SmtpReply


@dataclass(frozen=True, slots=True)
class Unbuildable:
    """The message cannot be built: its stored row, its data or its domain is unusable."""

    detail: str


@dataclass(frozen=True, slots=True)
class SuppressedSince:
    """The recipient was suppressed after the email was accepted."""

    reason: str


Outcome = (
    Replied
    | NoMailService
    | DnsFailure
    | PrivateTargets
    | Unreachable
    | SessionRefused
    | Unbuildable
    | SuppressedSince
)


@dataclass(frozen=True, slots=True)
class Decision:
    verdict: Verdict
    response: str  # what the recipient's log and events say


def classify(outcome: Outcome) -> Decision:
    """The verdict on one recipient's attempt (the table in this module's header)."""
    match outcome:
        case Replied(reply) if reply.is_success:
            return Decision(Verdict.DELIVERED, str(reply))
        case Replied(reply) if reply.is_permanent:
            return Decision(Verdict.BOUNCED, str(reply))
        case Replied(reply):
            return Decision(Verdict.DEFERRED, str(reply))
        case NoMailService(detail):
            return Decision(Verdict.BOUNCED, detail)
        case DnsFailure(detail) | PrivateTargets(detail) | Unreachable(detail):
            return Decision(Verdict.DEFERRED, detail)
        case SessionRefused(detail):
            return Decision(Verdict.REFUSED, detail)
        case Unbuildable(detail):
            return Decision(Verdict.FAILED, detail)
        case SuppressedSince(reason):
            return Decision(Verdict.FAILED, f"suppressed ({reason}) after the email was accepted")
    raise TypeError(f"not a delivery outcome: {outcome!r}")
