"""`/v1/admin/egress/`: the operator's egress sources and pools (issue 32), and the pool a
workspace or sending domain sends through. Platform administrators only
(engine/delivery/egress_admin.py); a source is a bind address and an EHLO name, a pool
weighs sources; the domain's pool wins over its workspace's, and neither means the default
egress."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Name, Out
from api.validation import json_body
from engine.delivery import egress_admin
from engine.delivery.egress_admin import PoolChange, SourceChange
from storage import egress
from storage.egress import Member, Pool, Source

blueprint = Blueprint("egress", __name__, url_prefix="/v1/admin")

Address = Field(min_length=2, max_length=45)
Ehlo = Field(min_length=1, max_length=253)


class CreateSource(In):
    name: Name
    bind_address: str = Address
    ehlo_name: str = Ehlo


class UpdateSource(In):
    """Only the fields given change."""

    name: Name | None = None
    bind_address: str | None = Field(None, min_length=2, max_length=45)
    ehlo_name: str | None = Field(None, min_length=1, max_length=253)


class SourceOut(Out):
    id: str
    name: str
    bind_address: str
    ehlo_name: str
    created_at: datetime
    updated_at: datetime


class SourceList(BaseModel):
    items: list[SourceOut]


class Weighted(In):
    source_id: str = Field(min_length=1, max_length=64)
    weight: int = Field(1, ge=1, le=1000)


class CreatePool(In):
    name: Name
    sources: list[Weighted] = Field(min_length=1, max_length=64)


class UpdatePool(In):
    name: Name | None = None
    sources: list[Weighted] | None = Field(None, min_length=1, max_length=64)


class WeightedOut(Out):
    source_id: str
    weight: int


class PoolOut(Out):
    id: str
    name: str
    sources: list[WeightedOut]
    created_at: datetime
    updated_at: datetime


class PoolList(BaseModel):
    items: list[PoolOut]


class Assignment(In):
    pool_id: str | None = Field(max_length=64)


class AssignmentOut(BaseModel):
    pool_id: str | None


def _source(source: Source) -> dict[str, Any]:
    return SourceOut.model_validate(source).model_dump(mode="json")


def _pool(pool: Pool) -> dict[str, Any]:
    return PoolOut.model_validate(pool).model_dump(mode="json")


def _members(given: list[Weighted] | None) -> tuple[Member, ...] | None:
    return None if given is None else tuple(Member(w.source_id, w.weight) for w in given)


# -- sources -----------------------------------------------------------------------------


@blueprint.get("/egress/sources")
@document_response(SourceList)
async def list_sources() -> dict[str, Any]:
    return {"items": [_source(s) for s in await egress_admin.list_sources(runtime(), principal())]}


@blueprint.post("/egress/sources")
@json_body(CreateSource)
@document_response(SourceOut, 201)
async def create_source(body: CreateSource) -> tuple[dict[str, Any], int]:
    change = SourceChange(body.name, body.bind_address, body.ehlo_name)
    return _source(await egress_admin.create_source(runtime(), principal(), change)), 201


@blueprint.get("/egress/sources/<id:source_id>")
@document_response(SourceOut)
async def get_source(source_id: str) -> dict[str, Any]:
    return _source(await egress_admin.get_source(runtime(), principal(), source_id))


@blueprint.patch("/egress/sources/<id:source_id>")
@json_body(UpdateSource)
@document_response(SourceOut)
async def update_source(source_id: str, body: UpdateSource) -> dict[str, Any]:
    change = SourceChange(body.name, body.bind_address, body.ehlo_name)
    return _source(await egress_admin.update_source(runtime(), principal(), source_id, change))


@blueprint.delete("/egress/sources/<id:source_id>")
async def delete_source(source_id: str) -> Response:
    await egress_admin.delete_source(runtime(), principal(), source_id)
    return Response(b"", status=204)


# -- pools -------------------------------------------------------------------------------


@blueprint.get("/egress/pools")
@document_response(PoolList)
async def list_pools() -> dict[str, Any]:
    return {"items": [_pool(p) for p in await egress_admin.list_pools(runtime(), principal())]}


@blueprint.post("/egress/pools")
@json_body(CreatePool)
@document_response(PoolOut, 201)
async def create_pool(body: CreatePool) -> tuple[dict[str, Any], int]:
    change = PoolChange(body.name, _members(body.sources))
    return _pool(await egress_admin.create_pool(runtime(), principal(), change)), 201


@blueprint.get("/egress/pools/<id:pool_id>")
@document_response(PoolOut)
async def get_pool(pool_id: str) -> dict[str, Any]:
    return _pool(await egress_admin.get_pool(runtime(), principal(), pool_id))


@blueprint.patch("/egress/pools/<id:pool_id>")
@json_body(UpdatePool)
@document_response(PoolOut)
async def update_pool(pool_id: str, body: UpdatePool) -> dict[str, Any]:
    change = PoolChange(body.name, _members(body.sources))
    return _pool(await egress_admin.update_pool(runtime(), principal(), pool_id, change))


@blueprint.delete("/egress/pools/<id:pool_id>")
async def delete_pool(pool_id: str) -> Response:
    await egress_admin.delete_pool(runtime(), principal(), pool_id)
    return Response(b"", status=204)


# -- assignments: the pool of a workspace or a sending domain ----------------------------


@blueprint.get("/workspaces/<id:target_id>/egress-pool")
@document_response(AssignmentOut)
async def workspace_pool(target_id: str) -> dict[str, Any]:
    found = await egress_admin.assigned(runtime(), principal(), egress.WORKSPACE, target_id)
    return {"pool_id": found}


@blueprint.put("/workspaces/<id:target_id>/egress-pool")
@json_body(Assignment)
@document_response(AssignmentOut)
async def assign_workspace_pool(target_id: str, body: Assignment) -> dict[str, Any]:
    pool_id = await egress_admin.assign(
        runtime(), principal(), egress.WORKSPACE, target_id, body.pool_id
    )
    return {"pool_id": pool_id}


@blueprint.get("/domains/<id:target_id>/egress-pool")
@document_response(AssignmentOut)
async def domain_pool(target_id: str) -> dict[str, Any]:
    found = await egress_admin.assigned(runtime(), principal(), egress.DOMAIN, target_id)
    return {"pool_id": found}


@blueprint.put("/domains/<id:target_id>/egress-pool")
@json_body(Assignment)
@document_response(AssignmentOut)
async def assign_domain_pool(target_id: str, body: Assignment) -> dict[str, Any]:
    pool_id = await egress_admin.assign(
        runtime(), principal(), egress.DOMAIN, target_id, body.pool_id
    )
    return {"pool_id": pool_id}
