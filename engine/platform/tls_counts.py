"""Delivered recipients counted by the TLS policy applied and the TLS they got, for `/metrics`.

Policies (what the delivered and deferred events record as `policy`): `dane` (the MX host's
TLSA records, with POSTROOM_DNSSEC on: engine/delivery/dane.py), `mta-sts` (the
recipient domain's MTA-STS policy, enforce or testing: engine/delivery/mta_sts.py),
`opportunistic` (STARTTLS when offered, nothing verified, plain text when it fails) and `none`
(no TLS was tried). Outcomes: `verified` (TLS, certificate valid for the MX name or matching its TLSA records), `encrypted`
(TLS, certificate not checked) and `plaintext`. Both are closed vocabularies, so the label set
of the counter never grows with what tenants send.
"""

from __future__ import annotations

from collections import Counter

POLICIES = ("dane", "mta-sts", "opportunistic", "none")
OUTCOMES = ("verified", "encrypted", "plaintext")


def outcome(tls_version: str | None, verified: bool) -> str:
    if tls_version is None:
        return "plaintext"
    return "verified" if verified else "encrypted"


class TlsDeliveries:
    """Counts shared by the router's queues (one per process)."""

    def __init__(self) -> None:
        self._counts: Counter[tuple[str, str]] = Counter()

    def note(self, policy: str, tls: str) -> None:
        self._counts[policy, tls] += 1

    def snapshot(self) -> tuple[tuple[str, str, int], ...]:
        """(policy, outcome, count) for every pair, zeros included, in a stable order."""
        return tuple((p, o, self._counts[p, o]) for p in POLICIES for o in OUTCOMES)
