"""Idempotency-Key: the same key with the same body within 24 hours answers the first
response again and sends nothing new; the same key with another body is 409.

Requests with one key are serialised on this node, so two racing retries cannot both send.
(Across nodes sharing PostgreSQL, a race within the same instant remains possible.)
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from datetime import timedelta
from typing import Any

import trio

from engine.errors import Conflict
from engine.runtime import Principal, Runtime
from storage import idempotency
from storage.idempotency import StoredResponse

WINDOW = timedelta(hours=24)

_in_flight: dict[tuple[str, str], trio.Lock] = {}


def request_hash(method: str, path: str, body: bytes) -> str:
    return hashlib.sha256(b"%s %s\n%s" % (method.encode(), path.encode(), body)).hexdigest()


async def once(
    rt: Runtime,
    who: Principal,
    key: str,
    digest: str,
    run: Callable[[], Awaitable[tuple[Any, int]]],
) -> tuple[Any, int]:
    """The response of `run`, or the stored first response for this key and body."""
    slot = (who.workspace_id, key)
    lock = _in_flight.setdefault(slot, trio.Lock())
    try:
        async with lock:
            stored = await rt.db.read(idempotency.get, who.workspace_id, key)
            now = rt.clock.now()
            if stored is not None and now - stored.created_at < WINDOW:
                if stored.request_hash != digest:
                    raise Conflict(
                        "this Idempotency-Key was used with a different request body",
                        code="idempotency_conflict",
                    )
                return stored.response, stored.status_code
            response, status = await run()
            await rt.db.write(
                idempotency.put,
                who.workspace_id,
                key,
                StoredResponse(digest, response, status, now),
            )
            return response, status
    finally:
        if not lock.statistics().tasks_waiting and not lock.locked():
            _in_flight.pop(slot, None)
