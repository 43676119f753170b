"""Idempotency-Key: the same key with the same body within 24 hours answers the first
response again and sends nothing new; the same key with another body is 409 (on the
API; the SMTP relay reads the key from the message's header and answers 250 or 550 5.7.0).

One rule for every node: before a request runs, its key is claimed in the database (a row
that at most one request holds, renewed by its node's heartbeat and freed if that node
dies). A second request with the key waits for the first one's stored response, on whatever
node it arrives; with another body it is 409 at once. A request that fails (a 4xx) stores
nothing and gives its claim back, so it can be retried with the same key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any

import trio

from engine.platform.errors import Conflict
from engine.platform.nodes import LEASE
from engine.platform.runtime import Principal, Runtime
from storage import idempotency
from storage.errors import is_outage
from storage.idempotency import StoredResponse
from storage.tx import Tx

WINDOW = timedelta(hours=24)
WAIT_POLL = 0.05  # seconds between looks for the stored response of a request in progress


def request_hash(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(b"%s %s\n%s" % (method.encode(), path.encode(), body)).hexdigest()


def _conflict() -> Conflict:
    return Conflict(
        "this Idempotency-Key was used with a different request body",
        code="idempotency_conflict",
    )


def _stored_or_claim(
    tx: Tx, workspace_id: str, key: str, digest: str, node: str, now: datetime
) -> StoredResponse | bool:
    """The stored response of the key (within the window); else True when `node` claimed
    it for this request, False while another request with the same body holds it."""
    stored = idempotency.get(tx, workspace_id, key)
    if stored is not None and now - stored.created_at < WINDOW:
        if stored.request_hash != digest:
            raise _conflict()
        return stored
    held = idempotency.claim(tx, workspace_id, key, digest, node, now, now + LEASE)
    if held is None:
        return True
    if held != digest:
        raise _conflict()
    return False


def _store(tx: Tx, workspace_id: str, key: str, stored: StoredResponse, node: str) -> None:
    idempotency.put(tx, workspace_id, key, stored)
    idempotency.unclaim(tx, workspace_id, key, node)


async def once(
    rt: Runtime,
    who: Principal,
    key: str,
    digest: str,
    run: Callable[[], Awaitable[tuple[Any, int]]],
) -> tuple[Any, int]:
    """The response of `run`, or the stored first response for this key and body."""
    return await once_in_workspace(rt, who.workspace_id, key, digest, run)


async def once_in_workspace(
    rt: Runtime,
    workspace_id: str,
    key: str,
    digest: str,
    run: Callable[[], Awaitable[tuple[Any, int]]],
) -> tuple[Any, int]:
    """`once` for a door that acts for a workspace without a user (the SMTP relay)."""
    while True:
        now = rt.clock.now()
        found = await rt.db.write(_stored_or_claim, workspace_id, key, digest, rt.node, now)
        if isinstance(found, StoredResponse):
            return found.response, found.status_code
        if found:
            break
        await trio.sleep(WAIT_POLL)
    try:
        response, status = await run()
    except BaseException:
        with trio.CancelScope(shield=True):
            await _settle(rt, workspace_id, key, None)
        raise
    stored = StoredResponse(digest, response, status, now)
    with trio.CancelScope(shield=True):  # what was sent must be remembered
        await _settle(rt, workspace_id, key, stored)
    return response, status


async def _settle(rt: Runtime, workspace_id: str, key: str, stored: StoredResponse | None) -> None:
    """Store the response (if any) and give the claim back; in an outage, leave both to the
    node's next beat (storage/idempotency.py `Unsettled`): the response is still the true
    answer, and a retry with the key waits for the claim, then finds the response stored."""
    try:
        if stored is None:
            await rt.db.write(idempotency.unclaim, workspace_id, key, rt.node)
        else:
            await rt.db.write(_store, workspace_id, key, stored, rt.node)
    except Exception as exc:
        if not is_outage(exc):
            raise
        rt.unsettled_claims.claims[(workspace_id, key)] = stored
