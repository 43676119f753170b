"""When to try a recipient again, and when to give up (docs/architecture.md section 7).

4xx replies and connection failures retry after 1m, 5m, 15m, 30m, 1h, 2h, 4h, 8h and then
every 8h; 72 hours after queueing the recipient has `failed`. Pure functions of the attempt
count and the times involved.
"""

from __future__ import annotations

from datetime import datetime, timedelta

BACKOFF = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=15),
    timedelta(minutes=30),
    timedelta(hours=1),
    timedelta(hours=2),
    timedelta(hours=4),
    timedelta(hours=8),
)
GIVE_UP_AFTER = timedelta(hours=72)


def next_attempt(failed_attempts: int, queued_at: datetime, now: datetime) -> datetime | None:
    """When to try again after `failed_attempts` (>= 1) failures; None once 72 h have passed.

    The last try is made at the 72-hour mark itself, so a recipient is never given up on
    early because the back-off step happened to be long.
    """
    deadline = queued_at + GIVE_UP_AFTER
    if now >= deadline:
        return None
    delay = BACKOFF[min(failed_attempts, len(BACKOFF)) - 1]
    return min(now + delay, deadline)
