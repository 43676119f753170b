"""The service's runtime and its virtual clock as tests read and move it: the time now, a
jump of the MockClock to a given time, and a known second of the next minute to jump to
(so which window a budget counts in never depends on the machine's speed)."""

from __future__ import annotations

from datetime import datetime, timedelta

from trio.testing import MockClock

from engine.platform.runtime import Runtime
from tests.harness.service import Service


def now(service: Service) -> datetime:
    return service.running.runtime.clock.now()


def move_to(service: Service, clock: MockClock, when: datetime) -> None:
    """Move the service's clock forward to `when`."""
    clock.jump((when - now(service)).total_seconds())


def minute_after(when: datetime, second: int = 5) -> datetime:
    return (when + timedelta(minutes=1)).replace(second=second, microsecond=0)


def runtime(service: Service) -> Runtime:
    return service.running.runtime
