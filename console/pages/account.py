"""The account: who is signed in, the workspace's plan and what it uses of each limit."""

from __future__ import annotations

from quart import Blueprint, Response

from console.web import page, rt, who
from engine import plans
from engine.accounts import workspaces

blueprint = Blueprint("account", __name__)


@blueprint.get("/account")
async def index() -> Response:
    principal = who()
    return await page(
        "account.html",
        title="Account",
        usage=await workspaces.usage(rt(), principal),
        plan=plans.plan(principal.plan),
        unlimited=plans.UNLIMITED,
    )
