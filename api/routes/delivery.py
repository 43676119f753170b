"""`/v1/delivery/`: destination policies, warm-up ramps and the backlog forecast (issue 19);
also `GET /v1/broadcasts/{id}/forecast`."""

from __future__ import annotations

from datetime import date, datetime
from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body, query_args
from engine.contacts import bulk_send
from engine.delivery import controls, forecast, policies
from engine.delivery.controls import PolicyChange
from engine.platform.errors import Unprocessable
from storage.delivery_policies import LIMIT_FIELDS, Ramp, Rule

blueprint = Blueprint("delivery", __name__, url_prefix="/v1")

Connections = Field(None, ge=1, le=1000)
Count = Field(None, ge=1, le=1_000_000_000)


class CreatePolicy(In):
    match: str = Field(min_length=1, max_length=255)
    domain_id: str | None = Field(None, max_length=64)
    max_connections: int | None = Connections
    messages_per_connection: int | None = Count
    per_minute: int | None = Count
    per_hour: int | None = Count
    per_day: int | None = Count


class UpdatePolicy(In):
    """Only the fields given change; a limit given as null is cleared."""

    match: str | None = Field(None, min_length=1, max_length=255)
    domain_id: str | None = Field(None, max_length=64)
    max_connections: int | None = Connections
    messages_per_connection: int | None = Count
    per_minute: int | None = Count
    per_hour: int | None = Count
    per_day: int | None = Count


class PolicyOut(Out):
    id: str
    builtin: bool
    name: str | None
    match: str
    domain_id: str | None
    max_connections: int | None
    messages_per_connection: int | None
    per_minute: int | None
    per_hour: int | None
    per_day: int | None
    created_at: datetime | None
    updated_at: datetime | None


class PolicyList(BaseModel):
    items: list[PolicyOut]
    precedence: str
    caps: dict[str, int | None]


class CreateRamp(In):
    domain_id: str = Field(min_length=1, max_length=64)
    first_day: int = Field(ge=1, le=1_000_000_000)
    factor: float = Field(2.0, ge=1.0, le=controls.MAX_FACTOR)
    target_per_day: int = Field(ge=2, le=1_000_000_000)
    starts_on: date | None = None


class UpdateRamp(In):
    first_day: int | None = Field(None, ge=1, le=1_000_000_000)
    factor: float | None = Field(None, ge=1.0, le=controls.MAX_FACTOR)
    target_per_day: int | None = Field(None, ge=2, le=1_000_000_000)
    starts_on: date | None = None


class RampOut(BaseModel):
    id: str
    domain_id: str
    first_day: int
    factor: float
    target_per_day: int
    starts_on: date
    day: int  # today is the ramp's day N (1 on its first)
    today_per_destination: int | None  # null once the target is reached
    complete: bool
    created_at: datetime
    updated_at: datetime


class ForecastQuery(In):
    broadcast_id: str | None = Field(None, max_length=64)


class LimitOut(Out):
    unit: str
    amount: int
    used: int
    source: str


class DestinationOut(Out):
    destination: str
    provider: str | None
    sending_domain_id: str
    domains: list[str]
    waiting: int
    limits: list[LimitOut]
    acceptance_rate: float | None
    last_leaves_at: datetime


class ForecastOut(Out):
    generated_at: datetime
    broadcast_id: str | None = None
    waiting: int
    last_leaves_at: datetime | None
    destinations: list[DestinationOut]


def _policy(rule: Rule) -> dict[str, Any]:
    out = PolicyOut.model_validate(rule)
    return out.model_dump(mode="json")


def ramp_out(ramp: Ramp) -> dict[str, Any]:
    today = runtime().clock.now().date()
    allowed = policies.allowance(ramp, today)
    out = RampOut(
        id=ramp.id,
        domain_id=ramp.domain_id,
        first_day=ramp.first_day,
        factor=ramp.factor,
        target_per_day=ramp.target_per_day,
        starts_on=ramp.starts_on,
        day=max(0, (today - ramp.starts_on).days) + 1,
        today_per_destination=allowed,
        complete=allowed is None,
        created_at=ramp.created_at,
        updated_at=ramp.updated_at,
    )
    return out.model_dump(mode="json")


def _limits(body: BaseModel, given: set[str]) -> dict[str, int | None]:
    return {name: getattr(body, name) for name in LIMIT_FIELDS if name in given}


# -- policies ----------------------------------------------------------------------------


@blueprint.get("/delivery/policies")
@document_response(PolicyList)
async def list_policies() -> dict[str, Any]:
    caps = runtime().delivery_caps
    return {
        "items": [_policy(r) for r in await controls.list_policies(runtime(), principal())],
        "precedence": policies.PRECEDENCE,
        "caps": {
            "max_connections": caps.max_connections,
            "messages_per_connection": caps.messages_per_connection,
            "per_minute": caps.per_minute,
            "per_hour": caps.per_hour,
            "per_day": caps.per_day,
        },
    }


@blueprint.post("/delivery/policies")
@json_body(CreatePolicy)
@document_response(PolicyOut, 201)
async def create_policy(body: CreatePolicy) -> tuple[dict[str, Any], int]:
    change = PolicyChange(
        match=body.match,
        domain_id=body.domain_id,
        domain_given=True,
        limits=_limits(body, set(LIMIT_FIELDS)),
    )
    return _policy(await controls.create_policy(runtime(), principal(), change)), 201


@blueprint.get("/delivery/policies/<id:policy_id>")
@document_response(PolicyOut)
async def get_policy(policy_id: str) -> dict[str, Any]:
    return _policy(await controls.get_policy(runtime(), principal(), policy_id))


@blueprint.patch("/delivery/policies/<id:policy_id>")
@json_body(UpdatePolicy)
@document_response(PolicyOut)
async def update_policy(policy_id: str, body: UpdatePolicy) -> dict[str, Any]:
    given = body.model_fields_set
    change = PolicyChange(
        match=body.match,
        domain_id=body.domain_id,
        domain_given="domain_id" in given,
        limits=_limits(body, given),
    )
    return _policy(await controls.update_policy(runtime(), principal(), policy_id, change))


@blueprint.delete("/delivery/policies/<id:policy_id>")
async def delete_policy(policy_id: str) -> Response:
    await controls.delete_policy(runtime(), principal(), policy_id)
    return Response(b"", status=204)


# -- ramps -------------------------------------------------------------------------------


@blueprint.get("/delivery/ramps")
@document_response(list[RampOut])
async def list_ramps() -> list[dict[str, Any]]:
    return [ramp_out(r) for r in await controls.list_ramps(runtime(), principal())]


@blueprint.post("/delivery/ramps")
@json_body(CreateRamp)
@document_response(RampOut, 201)
async def create_ramp(body: CreateRamp) -> tuple[dict[str, Any], int]:
    ramp = await controls.create_ramp(
        runtime(),
        principal(),
        body.domain_id,
        body.first_day,
        body.factor,
        body.target_per_day,
        body.starts_on,
    )
    return ramp_out(ramp), 201


@blueprint.get("/delivery/ramps/<id:ramp_id>")
@document_response(RampOut)
async def get_ramp(ramp_id: str) -> dict[str, Any]:
    return ramp_out(await controls.get_ramp(runtime(), principal(), ramp_id))


@blueprint.patch("/delivery/ramps/<id:ramp_id>")
@json_body(UpdateRamp)
@document_response(RampOut)
async def update_ramp(ramp_id: str, body: UpdateRamp) -> dict[str, Any]:
    fields = {name: getattr(body, name) for name in body.model_fields_set}
    if any(value is None for value in fields.values()):
        raise Unprocessable(
            "ramp fields cannot be null",
            errors=[
                {"loc": ["body", n], "msg": "may not be null"}
                for n, v in fields.items()
                if v is None
            ],
        )
    return ramp_out(await controls.update_ramp(runtime(), principal(), ramp_id, fields))


@blueprint.delete("/delivery/ramps/<id:ramp_id>")
async def delete_ramp(ramp_id: str) -> Response:
    await controls.delete_ramp(runtime(), principal(), ramp_id)
    return Response(b"", status=204)


# -- forecast ----------------------------------------------------------------------------


async def _forecast(broadcast_id: str | None) -> dict[str, Any]:
    rt, who = runtime(), principal()
    within = None
    if broadcast_id is not None:
        found = await bulk_send.broadcast(rt, who, broadcast_id)
        within = (found.domain_id, found.created_at, found.finished_at or rt.clock.now())
    result = await forecast.forecast(rt, who, within)
    out = ForecastOut.model_validate(result).model_dump(mode="json")
    out["broadcast_id"] = broadcast_id
    return out


@blueprint.get("/delivery/forecast")
@query_args(ForecastQuery)
@document_response(ForecastOut)
async def delivery_forecast(query: ForecastQuery) -> dict[str, Any]:
    return await _forecast(query.broadcast_id)


@blueprint.get("/broadcasts/<id:broadcast_id>/forecast")
@document_response(ForecastOut)
async def broadcast_forecast(broadcast_id: str) -> dict[str, Any]:
    return await _forecast(broadcast_id)
