"""What the sandbox answers each recipient: a script picked by the address's local part.

The scripts are data, in one table: a local part (before any `+tag`, any case) names how
many times the sandbox's server defers (4xx) before answering, whether its final answer is
a 5.1.1 bounce or a 250, how long it takes to answer, and what happens after delivery (a
complaint, an open, a click) and when. Any other address is delivered. Pure: no I/O here.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from engine.smtp.replies import SmtpReply

COMPLAINT, OPEN, CLICK = "complaint", "open", "click"


@dataclass(frozen=True, slots=True)
class Script:
    local_part: str
    description: str
    deferrals: int = 0  # 4xx answers before the final one, on the real retry schedule
    bounces: bool = False  # the final answer is 550 5.1.1 instead of 250
    delay: timedelta = timedelta(0)  # how long the server takes to answer the message
    later: tuple[tuple[str, timedelta], ...] = ()  # (outcome, after delivery)


DELIVER = Script("deliver", "accepted at once (250); so is any address not listed here")
SCRIPTS: tuple[Script, ...] = (
    DELIVER,
    Script(
        "bounce", "refused as an unknown mailbox (550 5.1.1): bounced and suppressed", bounces=True
    ),
    Script(
        "defer3-then-deliver",
        "deferred three times (451 4.3.0) on the real retry schedule, then accepted",
        deferrals=3,
    ),
    Script(
        "complain-after-1h",
        "accepted, then reported as spam an hour later: complained and suppressed",
        later=((COMPLAINT, timedelta(hours=1)),),
    ),
    Script(
        "open-and-click",
        "accepted, opened a minute later and its first link clicked a minute after that",
        later=((OPEN, timedelta(minutes=1)), (CLICK, timedelta(minutes=2))),
    ),
    Script(
        "slow", "accepted after the server takes 30 seconds to answer", delay=timedelta(seconds=30)
    ),
)
_BY_LOCAL_PART = {script.local_part: script for script in SCRIPTS}


def script_for(address: str) -> Script:
    """The script an address follows: its local part before any `+tag`, in any case."""
    local_part = address.rpartition("@")[0].partition("+")[0].lower()
    return _BY_LOCAL_PART.get(local_part, DELIVER)


def answer(script: Script, address: str, attempts: int) -> SmtpReply:
    """The server's answer to the message for `address`, after `attempts` earlier tries."""
    if attempts < script.deferrals:
        return SmtpReply.of(
            451,
            f"4.3.0 <{address}>: the sandbox defers this address"
            f" ({attempts + 1} of {script.deferrals})",
        )
    if script.bounces:
        return SmtpReply.of(550, f"5.1.1 <{address}>: no such mailbox (sandbox)")
    return SmtpReply.of(250, "2.0.0 accepted by the Postroom sandbox")
