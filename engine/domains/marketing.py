"""A sending domain's marketing stop: the complaint-rate guard (engine/contacts/complaint_guard.py)
stops a domain's mail that offers unsubscribe when its complaint rate passes the stop rate;
what its sender is told until a person resumes it. Single sends (engine/sending/intake.py)
and bulk sends (engine/contacts/bulk_send.py) are refused by the same rule.
"""

from __future__ import annotations

from storage.domains import Domain


def stopped_problem(domain: Domain) -> str | None:
    """Why the domain may send no mail that offers unsubscribe now, or None."""
    if domain.marketing_stopped_at is None:
        return None
    return (
        f"mail that offers unsubscribe from {domain.name} is stopped since"
        f" {domain.marketing_stopped_at.isoformat()}: its complaint rate passed the limit;"
        f" a person resumes it (POST /v1/domains/{domain.id}/marketing/resume)"
    )
