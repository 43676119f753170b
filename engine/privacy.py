"""Erasure of a person's address on request (GDPR art. 17): `POST /v1/privacy/erase`.

The storage rules are in storage/privacy.py (what is deleted, what rewritten, the hash kept
on the suppression list). Here: the address is normalised as everywhere (lower case); the
hash goes on the suppression list first, so no mail reaches the address while the rest is
rewritten; each pass then runs in batches of `BATCH` rows, one unit of work each, so a
large history never holds the writer long; the activity-log entry, which names only the
placeholder, comes last with what was touched. A request cut short leaves a partial erasure
that the same request, made again, completes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

import trio.lowlevel

from engine.activity import Change, record
from engine.errors import Unprocessable
from engine.runtime import Principal, Runtime
from storage import privacy
from storage.tx import Tx

BATCH = 200


@dataclass(frozen=True, slots=True)
class Erased:
    """What an erasure touched, by kind of record (`touched` by the names of
    storage.privacy.PASSES), and the hash the suppression list keeps."""

    contacts: int
    touched: dict[str, int]
    suppression_hash: str


def _log(tx: Tx, who: Principal, address: str, erased: Erased, now: datetime) -> None:
    meta = {"contacts": erased.contacts, **erased.touched}
    ph = privacy.placeholder(who.workspace_id, address)
    record(tx, who.workspace_id, who.user_email, Change("privacy.erased", ph, None, meta), now)


async def erase(rt: Runtime, who: Principal, address: str) -> Erased:
    """Erase `address` from the workspace's data; what it touched."""
    address = address.strip().lower()
    if "@" not in address or address.endswith("@" + privacy.PLACEHOLDER_DOMAIN):
        message = "email must be an address that is not already erased"
        raise Unprocessable(message, errors=[{"loc": ["body", "email"], "msg": message}])
    ws = who.workspace_id
    hashed: str = await rt.db.write(privacy.keep_suppressed, ws, address, rt.clock.now())
    contacts: int = await rt.db.write(privacy.erase_contacts, ws, address)
    rewrite = privacy.rewriter(ws, address)
    touched: dict[str, int] = {}
    for name, batch in privacy.PASSES:
        touched[name], after = 0, ""
        while True:
            done: privacy.Batch = await rt.db.write(batch, ws, address, rewrite, after, BATCH)
            touched[name] += done.touched
            if done.after is None:
                break
            after = done.after
            await trio.lowlevel.checkpoint()  # let the hot path's writes in between batches
    erased = Erased(contacts, touched, hashed)
    await rt.db.write(_log, who, address, erased, rt.clock.now())
    return erased
