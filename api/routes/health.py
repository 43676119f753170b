"""`/healthz` (is the service up?) and `/metrics` (Prometheus), both without authentication."""

from __future__ import annotations

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from quart import Blueprint, Response, current_app

from api.auth import public, runtime
from api.errors import error_response

blueprint = Blueprint("health", __name__)

HEALTH_TIMEOUT = 2.0


@blueprint.get("/healthz")
@public
async def healthz() -> Response:
    if not current_app.extensions["postroom.supervisor"].running:
        return error_response(503, "unavailable", "the engine's actors are not running")
    with trio.move_on_after(HEALTH_TIMEOUT):
        await runtime().db.read(lambda tx: tx.value("SELECT 1"))
        return Response('{"status":"ok"}', content_type="application/json")
    return error_response(503, "unavailable", "the database did not answer in time")


@blueprint.get("/metrics")
@public
async def metrics() -> Response:
    registry = current_app.extensions["postroom.metrics"]
    return Response(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)
