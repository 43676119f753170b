"""Fault isolation, the way OTP supervisors do it: one bad item never stops the service.

Two levels. An item (a webhook delivery, a forward job, a round of recipients) whose work
raises where it was not expected to counts a *fault*: the error is logged with its traceback
and counted for `/metrics`, the item is tried again after `RETRY_AFTER_FAULT`, and the one
that made its actor raise `QUARANTINE_AFTER` times is quarantined — its final status (`dead`
or `failed`) with the error in its log — so a restart can never crash-loop on it. An actor that
raises anyway is restarted by the supervisor (engine/platform/supervisor.py) with back-off.

A database outage is nobody's item's fault (storage/errors.py): it is never counted against
an item; the actor raises it and the supervisor waits the outage out.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta

from storage.errors import is_outage
from storage.leases import Fault, FaultPolicy

QUARANTINE_AFTER = 3
RETRY_AFTER_FAULT = timedelta(minutes=1)
ERROR_KEEP = 2048  # characters of an error kept with the item

log = logging.getLogger("postroom.faults")


def policy(now: datetime) -> FaultPolicy:
    """How faults recorded now are treated."""
    return FaultPolicy(retry_at=now + RETRY_AFTER_FAULT, quarantine_after=QUARANTINE_AFTER)


def describe(exc: BaseException) -> str:
    """An error as an item's log shows it."""
    return f"{type(exc).__name__}: {exc}"[:ERROR_KEEP]


def blames_item(exc: BaseException) -> bool:
    """Whether an exception raised while working an item counts against that item."""
    return isinstance(exc, Exception) and not is_outage(exc)


@dataclass(frozen=True, slots=True)
class FaultStatistics:
    """Per actor since start: item faults, items quarantined, and actor restarts."""

    faults: dict[str, int]
    quarantined: dict[str, int]
    restarts: dict[str, int]


class FaultLog:
    """Counts of faults for `/metrics`, shared by the supervisor and every actor."""

    def __init__(self) -> None:
        self._faults: dict[str, int] = defaultdict(int)
        self._quarantined: dict[str, int] = defaultdict(int)
        self._restarts: dict[str, int] = defaultdict(int)

    def item_fault(self, actor: str, what: str, exc: BaseException) -> str:
        """Log an item's fault with its traceback and count it; the error to record."""
        log.error("%s raised working %s", actor, what, exc_info=exc)
        self._faults[actor] += 1
        return describe(exc)

    def unreadable(self, actor: str, fault: Fault) -> None:
        """Log and count a row its actor could not even read (recorded by the claim)."""
        log.error("%s could not read item %s: %s", actor, fault.id, fault.error)
        self._faults[actor] += 1

    def quarantined(self, actor: str, count: int) -> None:
        if count:
            log.error(
                "%s quarantined %d items after %d faults each", actor, count, QUARANTINE_AFTER
            )
            self._quarantined[actor] += count

    def restarted(self, actor: str) -> None:
        self._restarts[actor] += 1

    def statistics(self) -> FaultStatistics:
        return FaultStatistics(dict(self._faults), dict(self._quarantined), dict(self._restarts))
