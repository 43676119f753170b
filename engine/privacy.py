"""Erasure of a person's address on request (GDPR art. 17): `POST /v1/privacy/erase`.

The storage rules are in storage/privacy.py (what is deleted, what rewritten, the hash kept
on the suppression list). Here: the address must be one (422 otherwise) and is normalised
as everywhere (lower case); the hash goes on the suppression list first, so no mail reaches
the address while the rest is rewritten, and the sends begun before it are waited for (one
that read the list just before commits its email after: the passes must see it); each pass
then runs in batches of `BATCH` rows, one unit of work each, so a large history never holds
the writer long; the activity-log entry, which names only the placeholder, comes last with
what was touched. A request cut short leaves a partial erasure that the same request, made
again, completes. On SQLite the write-ahead log is checkpointed and truncated at the end, so
the rewritten pages' old copies leave the files.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

import trio

from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform.runtime import Principal, Runtime
from engine.sending import statuses
from engine.sending.statuses import Trigger
from storage import privacy
from storage.tx import Tx

BATCH = 200
# How long an erasure waits for the sends begun before the address was suppressed (units of
# work of milliseconds; a transaction held open longer is not a send, and is not waited for).
IN_FLIGHT_WAIT = 30.0
IN_FLIGHT_POLL = 0.05

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Erased:
    """What an erasure touched, by kind of record (`touched` by the names of
    storage.privacy.PASSES), and the hash the suppression list keeps."""

    contacts: int
    touched: dict[str, int]
    suppression_hash: str


def _log(tx: Tx, who: Principal, erasure: privacy.Erasure, erased: Erased, now: datetime) -> None:
    meta = {"contacts": erased.contacts, **erased.touched}
    change = Change("privacy.erased", erasure.replacement, None, meta)
    record(tx, who.workspace_id, who.user_email, change, now)


async def erase(rt: Runtime, who: Principal, address: str) -> Erased:
    """Erase `address` from the workspace's data; what it touched."""
    # Only a whole address: a pattern (`%@%`) or a fragment would rewrite what it matched
    # of other addresses, and count rows it did not erase anything from.
    address = normalize_email(address.strip(), "email")
    ws = who.workspace_id
    hashed: str = await rt.db.write(privacy.keep_suppressed, ws, address, rt.clock.now())
    await _sends_in_flight_ended(rt)
    cancel = statuses.recipients_move(Trigger.CANCEL, (*statuses.WAITING, statuses.HELD))
    erasure = privacy.Erasure(
        ws, address, privacy.placeholder(hashed), cancel, statuses.SUMMARISE, rt.clock.now()
    )
    contacts: int = await rt.db.write(privacy.erase_contacts, ws, address)
    touched: dict[str, int] = {}
    for name, batch in privacy.PASSES:
        touched[name], after = 0, ""
        while True:
            done: privacy.Batch = await rt.db.write(batch, erasure, after, BATCH)
            touched[name] += done.touched
            if done.after is None:
                break
            after = done.after
            await trio.lowlevel.checkpoint()  # let the hot path's writes in between batches
    erased = Erased(contacts, touched, hashed)
    await rt.db.write(_log, who, erasure, erased, rt.clock.now())
    # SQLite keeps the pages it rewrote in its write-ahead log until a checkpoint: copy them
    # home and empty the log, so the old copies of the address leave the files now.
    await rt.db.checkpoint()
    return erased


async def _sends_in_flight_ended(rt: Runtime) -> None:
    """Wait for the transactions begun before the address was suppressed to end. A send that
    read the suppression list just before may still be writing its email (PostgreSQL commits
    it later, with an id the passes could have gone by): once it has ended, the passes see
    it, rewrite it and cancel its recipients."""
    moment = await rt.db.read(privacy.database_time)
    if moment is None:
        return
    with trio.move_on_after(IN_FLIGHT_WAIT):
        while await rt.db.read(privacy.begun_before, moment):  # noqa: ASYNC110 - nothing to wait on
            await trio.sleep(IN_FLIGHT_POLL)
        return
    log.warning(
        "an erasure waited %.0f s for transactions begun before it to end, and goes on:"
        " an email such a transaction is writing may keep the address",
        IN_FLIGHT_WAIT,
    )
