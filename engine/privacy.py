"""Erasure of a person's address on request (GDPR art. 17): `POST /v1/privacy/erase`.

The storage rule is in storage/privacy.py (what is deleted, what rewritten, the hash kept on
the suppression list). Here: the address is normalised as everywhere (lower case), the
erasure and its activity-log entry are one unit of work, and the entry names only the
placeholder, never the address it erased.
"""

from __future__ import annotations

from datetime import datetime

from engine.activity import Change, record
from engine.errors import Unprocessable
from engine.runtime import Principal, Runtime
from storage import privacy
from storage.privacy import Erased
from storage.tx import Tx


def _erase(tx: Tx, who: Principal, address: str, now: datetime) -> Erased:
    erased = privacy.erase(tx, who.workspace_id, address, now)
    meta = {
        "contacts": erased.contacts,
        "emails": erased.emails,
        "events": erased.events,
        "webhook_deliveries": erased.webhook_deliveries,
        "activity_entries": erased.activity_entries,
    }
    ph = privacy.placeholder(who.workspace_id, address)
    record(tx, who.workspace_id, who.user_email, Change("privacy.erased", ph, None, meta), now)
    return erased


async def erase(rt: Runtime, who: Principal, address: str) -> Erased:
    """Erase `address` from the workspace's data; what it touched."""
    address = address.strip().lower()
    if "@" not in address or address.endswith("@" + privacy.PLACEHOLDER_DOMAIN):
        message = "email must be an address that is not already erased"
        raise Unprocessable(message, errors=[{"loc": ["body", "email"], "msg": message}])
    erased: Erased = await rt.db.write(_erase, who, address, rt.clock.now())
    return erased
