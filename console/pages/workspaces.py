"""The workspace switcher: the choice is kept in a cookie (among the user's own workspaces,
checked on every request as the `X-Workspace-Id` header is)."""

from __future__ import annotations

from quart import Blueprint, Response

from console.web import WORKSPACE_COOKIE, form, go, rt, who
from engine.accounts import workspaces

blueprint = Blueprint("workspaces", __name__)


@blueprint.post("/workspace")
async def switch() -> Response:
    chosen = (await form()).get("workspace_id", "")
    mine = await workspaces.workspaces_of(rt(), who())
    response = go("console.overview.index")
    if any(view.workspace.id == chosen for view in mine):
        response.set_cookie(WORKSPACE_COOKIE, chosen, httponly=True, samesite="Lax", path="/")
    return response
