"""The complaint-rate guard's limits (engine/contacts/complaint_guard.py), as data, and what a
stopped domain's sender is told.

The rates are the big mailbox providers' bulk-sender rules: stay under 0.1% of delivered
mail reported as spam, never reach 0.3%. Under `min_deliveries` in the window a rate says
nothing (one complaint on a first hundred emails is 1%): nothing pauses or stops. The
minimum is the operator's (POSTROOM_COMPLAINT_MIN_DELIVERIES); the window is 30 days, the
span the providers' own postmaster dashboards average over.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from storage.domains import Domain

WINDOW = timedelta(days=30)
PAUSE_RATE = 0.001  # above it, the domain's broadcasts pause (a workspace may choose its own)
# The pause rates a workspace may choose: stricter than the default down to 0.05%, never
# laxer than the stop rate (a pause after the stop would pause nothing).
PAUSE_RATE_BOUNDS = (0.0005, 0.003)
STOP_RATE = 0.003  # above it, the domain's mail that offers unsubscribe stops
DEFAULT_MIN_DELIVERIES = 1_000


@dataclass(frozen=True, slots=True)
class Limits:
    min_deliveries: int = DEFAULT_MIN_DELIVERIES
    pause_rate: float = PAUSE_RATE
    stop_rate: float = STOP_RATE


def stopped_problem(domain: Domain) -> str | None:
    """Why the domain may send no mail that offers unsubscribe now, or None."""
    if domain.marketing_stopped_at is None:
        return None
    return (
        f"mail that offers unsubscribe from {domain.name} is stopped since"
        f" {domain.marketing_stopped_at.isoformat()}: its complaint rate passed the limit;"
        f" a person resumes it (POST /v1/domains/{domain.id}/marketing/resume)"
    )
