"""`/v1/workspace/complaint-guard`: the complaint rate above which the workspace's broadcasts
pause (within the service's bounds), and the limits it cannot change
(engine/contacts/complaint_guard.py)."""

from __future__ import annotations

from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body
from engine.contacts import complaint_guard
from engine.contacts.complaint_guard import Settings

blueprint = Blueprint("complaint_guard", __name__, url_prefix="/v1/workspace/complaint-guard")


class UpdateGuard(In):
    """`pause_rate` as a fraction (0.001 is 0.1%); null goes back to the default."""

    pause_rate: float | None


class GuardOut(Out):
    pause_rate: float
    default_pause_rate: float
    pause_rate_bounds: tuple[float, float]
    stop_rate: float  # above it, mail that offers unsubscribe stops until resumed
    min_deliveries: int  # delivered recipients in the window before a rate counts
    window_days: int


def _out(settings: Settings) -> dict[str, object]:
    return GuardOut.model_validate(settings).model_dump(mode="json")


@blueprint.get("")
@document_response(GuardOut)
async def get() -> dict[str, object]:
    return _out(await complaint_guard.settings(runtime(), principal()))


@blueprint.put("")
@json_body(UpdateGuard)
@document_response(GuardOut)
async def update(body: UpdateGuard) -> dict[str, object]:
    return _out(await complaint_guard.set_pause_rate(runtime(), principal(), body.pause_rate))
