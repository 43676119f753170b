"""What a check found about one of a domain's DNS records: its status, why, what to publish.

A record's status is one of four. `verified`: published and doing its job for the service;
`missing`: absent, or present without authorising the service; `invalid`: present but broken
for every receiver (an SPF permerror, an SPF record that lets any host send, a DMARC record
receivers discard); `pending`: not known yet (never checked, or DNS could not answer).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

PENDING, VERIFIED, MISSING, INVALID = "pending", "verified", "missing", "invalid"


@dataclass(frozen=True, slots=True)
class Finding:
    status: str
    # Why, in a sentence the owner can act on; None when there is nothing to say.
    detail: str | None = None
    # The whole record to publish in place of what is there (what is there kept, the service's
    # part added); None when the record given with the domain is the one to publish.
    suggested_value: str | None = None
    # What was read from DNS, as JSON values (the parsed DMARC policy, the SPF results).
    facts: dict[str, Any] = field(default_factory=dict)

    def stored(self) -> dict[str, Any]:
        """The finding as the JSON the domain keeps (storage `record_findings`)."""
        return {
            "detail": self.detail,
            "suggested_value": self.suggested_value,
            "facts": self.facts,
        }
