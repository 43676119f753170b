"""What a sending domain's recent deliveries say for its compliance report
(engine/domains/provider_rules.py): how many recipients of its mail were delivered, and how
many of those over TLS, and with a verified certificate, from the TLS facts each delivered
event records (`tls`: null, or its version, cipher and `verified`). One statement over the
cohort of the domain's mail created since a time, the cohort the complaint rate counts
(storage/complaint_rates.py), so both figures speak of the same mail.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import timestamp
from storage.tx import Dialect, Tx

# The TLS facts of an event's JSON metadata, read where they lie, per engine (the column is
# JSON text on both): the version (null when the delivery was plain text), and `verified`.
_TLS: dict[Dialect, tuple[str, str]] = {
    "sqlite": (
        "json_extract(v.metadata, '$.tls.version') IS NOT NULL",
        "json_extract(v.metadata, '$.tls.verified') = 1",
    ),
    "postgresql": (
        "(v.metadata::jsonb #>> '{tls,version}') IS NOT NULL",
        "(v.metadata::jsonb #>> '{tls,verified}') = 'true'",
    ),
}


@dataclass(frozen=True, slots=True)
class TlsShare:
    delivered: int  # delivered events of the domain's mail
    encrypted: int  # of which over TLS
    verified: int  # of which with the certificate verified for the MX name


def tls_share(tx: Tx, workspace_id: str, domain_id: str, start: datetime) -> TlsShare:
    """Deliveries of the domain's mail created from `start` on, and how many went over TLS."""
    encrypted, verified = _TLS[tx.dialect]
    row = tx.one(
        "SELECT COUNT(*) AS delivered,"
        f" COALESCE(SUM(CASE WHEN {encrypted} THEN 1 ELSE 0 END), 0) AS encrypted,"
        f" COALESCE(SUM(CASE WHEN {verified} THEN 1 ELSE 0 END), 0) AS verified"
        " FROM email_events v JOIN emails e ON e.id = v.email_id"
        " WHERE e.workspace_id = :ws AND e.domain_id = :domain AND e.created_at >= :start"
        " AND v.event_type = 'delivered'",
        {"ws": workspace_id, "domain": domain_id, "start": timestamp(start)},
    )
    assert row is not None
    return TlsShare(int(row["delivered"]), int(row["encrypted"]), int(row["verified"]))
