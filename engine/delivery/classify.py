"""What happened to a recipient in a delivery attempt, and what it means: one pure function.

The delivery path turns everything that can end an attempt into a small tree of typed
outcomes (the server's reply, DNS, the connection, TLS, our own private-target rule, a
message that cannot be built, a late suppression), and `classify` decides each one's fate
from a table (docs/architecture.md section 7, docs/decisions.md):

| outcome | verdict |
|---|---|
| 2xx reply | delivered |
| 4xx reply, no answer, a broken connection, DNS not answering | deferred (retry schedule) |
| a reply saying the recipient is gone (engine/delivery/bounces.py) | bounced, the address suppressed |
| a reply saying the mailbox is full, 4xx or 5xx | soft-bounced: deferred, and counted |
| any other 5xx (the message, the protocol, the system, a policy) | undeliverable: failed, never suppressed |
| null MX, or neither MX nor address records | bounced, the address suppressed |
| every MX host refused the session for good (5xx greeting, EHLO and HELO refused) | refused: bounced, never suppressed |
| MX hosts only on private addresses (our rule) | deferred, never suppressed |
| a message that cannot be built, a recipient suppressed since | failed, never sent |
| a sender-side block, rate limit or DNS failure (`incident_kind`) | incident: deferred, never suppressed |

`REFUSED` is the kind for "the destination refused us, not the recipient": what a
`PermanentFailure` of the session says. `INCIDENT` is a fact about the sending side and the
destination (KumoMTA's distinction): a 5.7.x policy or reputation block, a 4.7.x (or 421)
rate limit, our authentication (SPF, DKIM, DMARC, PTR) refused, or DNS not answering. The
recipient is deferred on the retry schedule and never suppressed, and the destination is
paused for the sending domain (engine/delivery/incidents.py). X.2.x replies are about the
mailbox (Gmail's "450 4.2.1 ... receiving mail at a rate" is one hot mailbox): per recipient.
A reply to MAIL FROM is about our sender or the message, never about the recipient.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.delivery.bounces import Blame, blame, dsn_code
from engine.smtp.replies import SmtpReply

if TYPE_CHECKING:  # the outcome only carries it: classify reads nothing of a connection
    from engine.smtp.session import Peer


class Verdict(enum.Enum):
    DELIVERED = "delivered"
    DEFERRED = "deferred"  # tried again on the retry schedule; failed 72 h after queueing
    BOUNCED = "bounced"  # the recipient cannot receive mail: bounced and suppressed
    SOFT_BOUNCED = "soft_bounced"  # mailbox full: deferred, and counted toward a suppression
    UNDELIVERABLE = "undeliverable"  # refused for the message, not the recipient: failed
    REFUSED = "refused"  # the destination refused us, not the recipient: bounced, not suppressed
    FAILED = "failed"  # never sent and never will be: our data, or a suppression since
    INCIDENT = "incident"  # the sending side is blocked or slowed: deferred, not suppressed


class IncidentKind(enum.Enum):
    """Why a destination refuses or slows a sending domain's mail."""

    BLOCKED = "blocked"  # policy or reputation block of our IP or domain (5.7.x)
    UNAUTHENTICATED = "unauthenticated"  # our SPF, DKIM, DMARC or PTR did not satisfy it
    RATE_LIMITED = "rate_limited"  # too much, too fast (4.7.x, 421)
    DNS = "dns"  # DNS did not answer for the destination


@dataclass(frozen=True, slots=True)
class Replied:
    """The server's reply that decides the recipient (RCPT, else DATA's, else MAIL's);
    `at_mail` when it is MAIL FROM's (about our sender, never the recipient)."""

    reply: SmtpReply
    at_mail: bool = False
    peer: Peer | None = None  # the server that replied (the delivered event records it)


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
    policy: str | None = None  # the TLS policy the hosts were tried under, when known
    tls_policy: bool = False  # some host was passed over for the TLS policy (never plain)


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
    incident: IncidentKind | None = None  # set when the verdict is INCIDENT
    dsn: str | None = None  # the RFC 3463 status of a reply that did not deliver
    blame: Blame | None = None  # what a failure reply is about (engine/delivery/bounces.py)


# Words that put a reply's blame on the sending side. Our authentication first: Microsoft's
# "RESOLVER.RST.AuthRequired; authentication required" is a recipient that takes internal
# mail only, so bare "authentication" is not among them.
_UNAUTHENTICATED = re.compile(
    r"unauthenticated|\b(spf|dkim|dmarc)\b|\bptr\b|reverse dns|rdns|authentication level"
    r"|starttls|encryption",
    re.IGNORECASE,
)
_SENDER_SIDE = re.compile(
    r"reputation|block ?list|black ?list|spamhaus|\bbanned\b|\bblocked\b|\bblock\b|spam"
    r"|unsolicited|complaints|\bpolicy\b|\bip\b|from your|\[(tss|cs)\d+\]",
    re.IGNORECASE,
)
# A message blocked for what it carries is that message's failure, not a block of the sender:
# Gmail's "552 5.7.0 This message was blocked because its content presents a potential
# security issue" fails that email and leaves the destination open.
_CARRIED = re.compile(
    r"\bits content\b|content presents|attachment|virus|malware|executable", re.IGNORECASE
)
_RATE = re.compile(
    r"\brate\b|too many (connections|sessions|messages)|volume|throttl|server busy|try again later",
    re.IGNORECASE,
)


def incident_kind(reply: SmtpReply) -> IncidentKind | None:
    """The destination incident a reply reports, or None when it is about the recipient or
    the message (X.1.x addresses, X.2.x mailboxes, X.3.x-X.6.x systems and content) or is a
    plain temporary failure. Only X.7.x (security or policy) and replies without an enhanced
    status code are read for the sending side's blame."""
    status, text = reply.enhanced_status, reply.text
    subject = None if status is None else status.split(".")[1]
    if subject not in ("7", None):
        return None
    if _UNAUTHENTICATED.search(text):
        return IncidentKind.UNAUTHENTICATED
    if _CARRIED.search(text):
        return None
    if reply.is_transient:
        if subject == "7" or reply.code == 421 or _RATE.search(text):
            return IncidentKind.RATE_LIMITED
        return None
    # Microsoft answers 5.7.6xx and 5.7.7xx for banned sending IPs and tenants, text or not.
    detail = "" if status is None else status.split(".")[2]
    if _SENDER_SIDE.search(text) or (len(detail) == 3 and detail[0] in "67"):
        return IncidentKind.BLOCKED
    return None  # a recipient's own policy ("Recipient address rejected: Access denied")


def classify(outcome: Outcome) -> Decision:
    """The verdict on one recipient's attempt (the table in this module's header)."""
    match outcome:
        case Replied(reply) if reply.is_success:
            return Decision(Verdict.DELIVERED, str(reply))
        case Replied(reply) | Unreachable(_, reply) if (
            reply is not None and (kind := incident_kind(reply)) is not None
        ):
            detail = str(reply) if isinstance(outcome, Replied) else outcome.detail
            return Decision(Verdict.INCIDENT, detail, kind, dsn_code(reply))
        case Replied(reply, at_mail):
            return _failure(reply, at_mail)
        case NoMailService(detail):
            # RFC 3463 X.1.2: the destination system in the address accepts no mail.
            return Decision(Verdict.BOUNCED, detail, dsn="5.1.2", blame=Blame.RECIPIENT)
        case DnsFailure(detail):
            return Decision(Verdict.INCIDENT, detail, IncidentKind.DNS)
        case PrivateTargets(detail) | Unreachable(detail):
            return Decision(Verdict.DEFERRED, detail)
        case SessionRefused(detail, reply):
            return Decision(Verdict.REFUSED, detail, dsn=dsn_code(reply))
        case Unbuildable(detail):
            return Decision(Verdict.FAILED, detail)
        case SuppressedSince(reason):
            return Decision(Verdict.FAILED, f"suppressed ({reason}) after the email was accepted")
    raise TypeError(f"not a delivery outcome: {outcome!r}")


def _failure(reply: SmtpReply, at_mail: bool) -> Decision:
    """The verdict on a 4xx or 5xx reply that is no destination incident."""
    # A refused MAIL FROM is about our sender, but an X.6.x refusal there is about the
    # message's content or form (5.6.7: a UTF-8 header a hop without SMTPUTF8 cannot take).
    status = reply.enhanced_status or ""
    about = blame(reply)
    if at_mail and reply.is_permanent and status[1:4] != ".6.":
        about = Blame.SENDER
    response, code = str(reply), dsn_code(reply)
    if about is Blame.MAILBOX_FULL:
        return Decision(Verdict.SOFT_BOUNCED, response, dsn=code, blame=about)
    if reply.is_transient:
        return Decision(Verdict.DEFERRED, response, dsn=code, blame=about)
    if about is Blame.RECIPIENT:
        return Decision(Verdict.BOUNCED, response, dsn=code, blame=about)
    return Decision(Verdict.UNDELIVERABLE, response, dsn=code, blame=about)
