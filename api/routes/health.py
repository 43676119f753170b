"""`/healthz` (is the service up?), without authentication, and `/metrics` (Prometheus),
which needs `Authorization: Bearer <POSTROOM_METRICS_TOKEN>` when that is set: its queue
depths name every tenant's recipient domains.

`/healthz` answers 503 when the actors are down or the database does not answer, and 503
`degraded` while the database is full (writes refused until space returns).
"""

from __future__ import annotations

import hmac
from typing import Protocol

import trio
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel
from quart import Blueprint, Response, current_app, request
from quart_schema import document_response

from api.auth import public, runtime
from api.errors import error_response
from engine.platform.errors import Unauthorized

blueprint = Blueprint("health", __name__)

HEALTH_TIMEOUT = 2.0


class Scrape(Protocol):
    """What `/metrics` serves: a registry, with counts read from the database before each
    scrape (so rendering it never blocks the event loop)."""

    registry: CollectorRegistry

    async def refresh(self) -> None: ...


class HealthOut(BaseModel):
    status: str  # "ok"


@blueprint.get("/healthz")
@public
@document_response(HealthOut)
async def healthz() -> Response:
    if not current_app.extensions["postroom.supervisor"].running:
        return error_response(503, "unavailable", "the engine's actors are not running")
    db = runtime().db
    with trio.move_on_after(HEALTH_TIMEOUT):
        await db.read(lambda tx: tx.value("SELECT 1"))
        if (full := db.storage_full) is not None:
            return error_response(
                503,
                "storage_full",
                "the database has no space left: writes are refused until space returns",
                status="degraded",
                storage=f"full: {full.reason}",
            )
        return Response('{"status":"ok"}', content_type="application/json")
    return error_response(503, "unavailable", "the database did not answer in time")


@blueprint.get("/metrics")
@public  # not an API key: its own token, checked here before the database is asked anything
async def metrics() -> Response:
    token: str | None = current_app.extensions["postroom.metrics_token"]
    if token is not None and not _bearer_matches(request.headers.get("Authorization", ""), token):
        raise Unauthorized("use 'Authorization: Bearer <POSTROOM_METRICS_TOKEN>'")
    scrape: Scrape = current_app.extensions["postroom.metrics"]
    await scrape.refresh()
    return Response(generate_latest(scrape.registry), content_type=CONTENT_TYPE_LATEST)


def _bearer_matches(authorization: str, token: str) -> bool:
    scheme, _, credential = authorization.partition(" ")
    # Bytes, so the comparison takes constant time whatever characters the caller sent.
    matches = hmac.compare_digest(credential.strip().encode(), token.encode())
    return scheme.lower() == "bearer" and matches
