"""`/v1/mcp/policy`: what agents may do through the MCP door in this workspace.

The policy is set here (and in the console), never through the door itself: `off`, `read`
(the default) or `send`, and the most recipients one agent action may reach.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import json_body
from engine.agents import policy
from engine.agents.policy import McpPolicy

blueprint = Blueprint("mcp_policy", __name__, url_prefix="/v1/mcp/policy")


class PolicyOut(BaseModel):
    policy: str
    max_recipients: int
    updated_at: datetime | None


class PolicyChange(In):
    policy: str | None = Field(
        None, max_length=20, description="off, read or send; omitted: unchanged"
    )
    max_recipients: int | None = Field(
        None, description="most recipients one agent action may reach; omitted: unchanged"
    )


def _out(current: McpPolicy) -> dict[str, object]:
    return PolicyOut(
        policy=current.level,
        max_recipients=current.max_recipients,
        updated_at=current.updated_at,
    ).model_dump(mode="json")


@blueprint.get("")
@document_response(PolicyOut)
async def get() -> dict[str, object]:
    return _out(await policy.current(runtime(), principal()))


@blueprint.patch("")
@json_body(PolicyChange)
@document_response(PolicyOut)
async def update(body: PolicyChange) -> dict[str, object]:
    changed = await policy.update(runtime(), principal(), body.policy, body.max_recipients)
    return _out(changed)
