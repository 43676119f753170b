"""The operator's settings that the runtime carries to features: caps on delivery, and the
complaint-rate guard's limits and window (engine/contacts/complaint_guard.py).

The complaint rates are the big mailbox providers' bulk-sender rules: stay under 0.1% of
delivered mail reported as spam, never reach 0.3%. Under `min_deliveries` in the window a
rate says nothing (one complaint on a first hundred emails is 1%): nothing pauses or stops.
The minimum is the operator's (POSTROOM_COMPLAINT_MIN_DELIVERIES). The window is 30 days,
the span the providers' own postmaster dashboards average over.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta


@dataclass(frozen=True, slots=True)
class Caps:
    """Operator-wide caps (POSTROOM_DELIVERY_MAX_*); None: no cap."""

    max_connections: int = 20
    messages_per_connection: int | None = None
    per_minute: int | None = None
    per_hour: int | None = None
    per_day: int | None = None


PAUSE_RATE = 0.001  # above it, the domain's broadcasts pause (a workspace may choose its own)
# The pause rates a workspace may choose: stricter than the default down to 0.05%, never
# laxer than the stop rate (a pause after the stop would pause nothing).
PAUSE_RATE_BOUNDS = (0.0005, 0.003)
STOP_RATE = 0.003  # above it, the domain's mail that offers unsubscribe stops
DEFAULT_MIN_DELIVERIES = 1_000
COMPLAINT_WINDOW = timedelta(days=30)  # the rates count the domain's mail created in it


@dataclass(frozen=True, slots=True)
class ComplaintLimits:
    min_deliveries: int = DEFAULT_MIN_DELIVERIES
    pause_rate: float = PAUSE_RATE
    stop_rate: float = STOP_RATE
