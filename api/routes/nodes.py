"""`GET /v1/admin/nodes`: the nodes sharing the database, for platform administrators."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import Out
from engine.accounts import users as accounts
from engine.platform import nodes

blueprint = Blueprint("nodes", __name__, url_prefix="/v1/admin/nodes")


class NodeOut(Out):
    id: str
    host: str
    pid: int
    role: str  # all, intake or delivery (`serve --workers N` splits the work)
    state: str
    started_at: datetime
    heartbeat_at: datetime
    stopped_at: datetime | None
    holds: dict[str, int] = {}


class NodesOut(BaseModel):
    items: list[NodeOut]


@blueprint.get("")
@document_response(NodesOut)
async def list_nodes() -> dict[str, object]:
    rt = runtime()
    await accounts.require_admin(rt, principal())
    views = await nodes.listed(rt)
    items = [
        NodeOut.model_validate(view.node).model_copy(update={"holds": view.holds}) for view in views
    ]
    return NodesOut(items=items).model_dump()
