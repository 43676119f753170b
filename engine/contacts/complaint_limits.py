"""The complaint-rate guard's window and what a stopped domain's sender is told; its rates
and the operator's minimum are settings (engine/platform/settings.py `ComplaintLimits`).

The window is 30 days, the span the providers' own postmaster dashboards average over.
"""

from __future__ import annotations

from datetime import timedelta

from storage.domains import Domain

WINDOW = timedelta(days=30)


def stopped_problem(domain: Domain) -> str | None:
    """Why the domain may send no mail that offers unsubscribe now, or None."""
    if domain.marketing_stopped_at is None:
        return None
    return (
        f"mail that offers unsubscribe from {domain.name} is stopped since"
        f" {domain.marketing_stopped_at.isoformat()}: its complaint rate passed the limit;"
        f" a person resumes it (POST /v1/domains/{domain.id}/marketing/resume)"
    )
