"""The one-time 24-hour override of a suppression (spec: Suppression override).

A suppressed recipient is rejected on the first attempt, which opens a 24-hour window. One
retry within the window (the retry endpoint, or a new send to the address) is delivered
once; every later attempt is rejected. An attempt after the window counts as a fresh first
attempt: rejected again, opening a new window. Validation never consumes or counts.
An erased address (`POST /v1/privacy/erase`) is never overridden and opens no window: the
person asked never to be mailed again, and a window would write the address back. Neither
is an unsubscribe or a complaint: they are the recipient's own word, which a sender's retry
must not outvote; the override exists for bounces (and manual entries), which can be wrong.

`decide` is pure; the caller stores what it returns inside the send's own unit of work.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum

from storage.suppressions import ERASED

WINDOW = timedelta(hours=24)
# Reasons no override lifts.
FINAL = frozenset({ERASED, "unsubscribe", "complaint"})


class Verdict(Enum):
    REJECT_AND_OPEN_WINDOW = "reject_and_open_window"
    ALLOW_ONCE = "allow_once"
    REJECT = "reject"


@dataclass(frozen=True, slots=True)
class OverrideState:
    rejected_at: datetime
    used_at: datetime | None


def decide(state: OverrideState | None, now: datetime, reason: str = "") -> Verdict:
    """What an attempt to send to an address suppressed for `reason` at `now` gets."""
    if reason in FINAL:
        return Verdict.REJECT
    if state is None or now - state.rejected_at >= WINDOW:
        return Verdict.REJECT_AND_OPEN_WINDOW
    if state.used_at is None:
        return Verdict.ALLOW_ONCE
    return Verdict.REJECT


def available(state: OverrideState | None, now: datetime, reason: str = "") -> bool:
    """Whether an attempt now would be allowed (without counting as one)."""
    return decide(state, now, reason) is Verdict.ALLOW_ONCE
