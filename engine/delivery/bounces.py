"""What a failure reply says is wrong, read by its enhanced status code (RFC 3463), and when
repeated mailbox-full replies mean the mailbox is gone. Pure functions, no I/O.

Rules:
- Only a reply saying the recipient's address is gone suppresses it: X.1.x (but X.1.7 and
  X.1.8, which are about our sender), X.2.1 (disabled), X.7.13/17/18 (account disabled,
  mailbox or domain owner changed, RFC 7293), and Microsoft's directory-based edge block
  (5.4.1 "Recipient address rejected"). Everything else at 5xx is about the message (size,
  content, format), the protocol, the receiving system or the recipient's own policy: that
  email fails, the address stays deliverable.
- Mailbox full (X.2.2, or its words) is a soft bounce at 4xx and 5xx alike: the recipient
  is tried again on the retry schedule, and the address is suppressed only once its mailbox
  has been full `SOFT_BOUNCE_LIMIT` times, each at least `SOFT_BOUNCE_SPACING` apart, within
  `SOFT_BOUNCE_WINDOW` with no delivery between (`tally`).
- A specific code decides; a generic one (X.0.0, X.Y.0) or none leaves it to the reply's
  words (providers' phrasings, e.g. Yahoo's "554 delivery error: dd This user doesn't have a
  yahoo.com account"); words nobody recognises never suppress.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass
from datetime import datetime, timedelta

from engine.smtp.replies import SmtpReply

SOFT_BOUNCE_LIMIT = 3
SOFT_BOUNCE_SPACING = timedelta(hours=24)  # full again sooner counts once: one retry series
SOFT_BOUNCE_WINDOW = timedelta(days=14)


class Blame(enum.Enum):
    """What a failure reply is about."""

    RECIPIENT = "recipient"  # the address is gone: bounced, suppressed
    MAILBOX_FULL = "mailbox_full"  # a soft bounce: tried again, counted
    SENDER = "sender"  # our envelope sender (X.1.7, X.1.8, "Sender address rejected")
    MESSAGE = "message"  # its size, content or format (X.2.3, X.3.4, X.6.x)
    PROTOCOL = "protocol"  # the SMTP conversation (X.5.x, 500-504)
    SYSTEM = "system"  # the receiving system or routing (X.3.x, X.4.x)
    POLICY = "policy"  # the recipient's own policy (X.7.x that is no sending-side block)
    UNKNOWN = "unknown"  # words we do not recognise: never suppresses


# (subject, detail) of specific codes; a subject alone for the rest of its codes.
_SPECIFIC: dict[tuple[int, int], Blame] = {
    (1, 7): Blame.SENDER,  # bad sender's mailbox address syntax
    (1, 8): Blame.SENDER,  # bad sender's system address
    (2, 1): Blame.RECIPIENT,  # mailbox disabled, not accepting messages
    (2, 2): Blame.MAILBOX_FULL,
    (2, 3): Blame.MESSAGE,  # message length exceeds the mailbox's limit
    (2, 4): Blame.SYSTEM,  # mailing list expansion problem
    (3, 4): Blame.MESSAGE,  # message too big for the system
    (7, 13): Blame.RECIPIENT,  # user account disabled (RFC 5248)
    (7, 17): Blame.RECIPIENT,  # mailbox owner has changed (RFC 7293)
    (7, 18): Blame.RECIPIENT,  # domain owner has changed (RFC 7293)
    (7, 27): Blame.SENDER,  # sender address has null MX (RFC 7505)
}
_SUBJECT: dict[int, Blame] = {
    1: Blame.RECIPIENT,  # addressing: 5.1.1 no such user, 5.1.2 no such domain, 5.1.10 null MX
    2: Blame.UNKNOWN,
    3: Blame.SYSTEM,
    4: Blame.SYSTEM,
    5: Blame.PROTOCOL,
    6: Blame.MESSAGE,
    7: Blame.POLICY,
}

# Words, for replies with a generic code or none. Mailbox full and our sender first: "Sender
# address rejected: User unknown" is about our sender, "user is over quota" about a full box.
_FULL = re.compile(
    r"over ?quota|quota (exceeded|full)|exceed\w* (its |the )?(quota|storage allocation)"
    r"|(mailbox|inbox|mail ?box|account|mailfolder|user) (is )?(full|over)\b"
    r"|out of storage|insufficient (storage|space) (for|in) (the )?(user|mailbox|recipient)"
    r"|mailbox size limit|storage (space )?(limit|quota)",
    re.IGNORECASE,
)
_SENDER = re.compile(
    r"sender address rejected|sender verify failed|sender (domain|address) (must|does not)"
    r"|bad sender|invalid sender|return path",
    re.IGNORECASE,
)
_GONE = re.compile(
    r"user (unknown|not found|doesn'?t exist|does not exist)|unknown (user|recipient|address)"
    r"|no such (user|mailbox|recipient|address|account|person)|(recipient|address|user)"
    r" (not found|unknown|invalid)|(mailbox|account|address|recipient|user)"
    r" (does not|doesn'?t|no longer) exists?|(mailbox|account) (not found|unavailable"
    r"|is unavailable|disabled|is disabled|has been disabled|deactivated|inactive|closed)"
    r"|invalid (mailbox|recipient|address)|not a valid (mailbox|user|recipient)"
    r"|doesn'?t have an? [\w.-]+ account|not our customer|unrouteable address"
    r"|bad destination mailbox|no mailbox (here|by that name)|addressee unknown"
    r"|recipientnotfound|address lookup failed|user doesn'?t|account expired",
    re.IGNORECASE,
)
_CONTENT = re.compile(
    r"too (big|large|long)|size (limit|exceeds)|exceeds? (the )?(maximum |fixed )?(message )?size"
    r"|content|virus|malware|attachment|message (refused|rejected)",
    re.IGNORECASE,
)
# Microsoft 365's directory-based edge blocking: "550 5.4.1 Recipient address rejected: Access
# denied. AS(201806281)" means no such recipient in the tenant.
_EDGE_BLOCKED = re.compile(r"recipient address rejected", re.IGNORECASE)


def _codes(reply: SmtpReply) -> tuple[int, int] | None:
    status = reply.enhanced_status
    if status is None:
        return None
    _, subject, detail = status.split(".")
    return int(subject), int(detail)


def _by_words(text: str) -> Blame | None:
    for pattern, blame in (
        (_FULL, Blame.MAILBOX_FULL),
        (_SENDER, Blame.SENDER),
        (_GONE, Blame.RECIPIENT),
        (_CONTENT, Blame.MESSAGE),
    ):
        if pattern.search(text):
            return blame
    return None


def blame(reply: SmtpReply) -> Blame:
    """What a 4xx or 5xx reply (about one recipient or its message) says is wrong."""
    codes, text = _codes(reply), reply.text
    if _SENDER.search(text):
        return Blame.SENDER
    if codes is not None:
        subject, detail = codes
        if (subject, detail) == (4, 1) and _EDGE_BLOCKED.search(text):
            return Blame.RECIPIENT
        if (subject, detail) in _SPECIFIC:
            return _SPECIFIC[(subject, detail)]
        if subject != 0 and detail != 0:
            return _SUBJECT.get(subject, Blame.UNKNOWN)
    words = _by_words(text)
    if words is not None:
        return words
    if codes is not None and codes[0] != 0:
        return _SUBJECT.get(codes[0], Blame.UNKNOWN)
    if 500 <= reply.code <= 504:
        return Blame.PROTOCOL
    return Blame.UNKNOWN


def dsn_code(reply: SmtpReply) -> str:
    """The enhanced status code a reply carries, else the generic one of its class."""
    return reply.enhanced_status or f"{reply.code // 100}.0.0"


@dataclass(frozen=True, slots=True)
class Tally:
    """An address's mailbox-full replies that count: how many, the first and the last."""

    count: int
    first_at: datetime
    last_at: datetime

    @property
    def exhausted(self) -> bool:
        """The mailbox has been full often enough, for long enough, to be taken as gone."""
        return self.count >= SOFT_BOUNCE_LIMIT


def tally(previous: Tally | None, now: datetime) -> Tally:
    """The count after one more mailbox-full reply at `now` (a delivery clears it)."""
    if previous is None or now - previous.first_at > SOFT_BOUNCE_WINDOW:
        return Tally(1, now, now)
    if now - previous.last_at < SOFT_BOUNCE_SPACING:
        return previous
    return Tally(previous.count + 1, previous.first_at, now)
