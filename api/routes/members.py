"""`/v1/workspace/members`: the workspace's team. List, change a role, remove, leave, and
hand the workspace to another member (engine/team.py has the rules)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body
from engine import team

blueprint = Blueprint("members", __name__, url_prefix="/v1/workspace/members")


class MemberItem(Out):
    user_id: str
    email: str
    role: str
    joined_at: datetime


class ChangeRole(In):
    role: Literal["admin", "developer", "viewer"]


def _out(member: object) -> dict[str, object]:
    return MemberItem.model_validate(member).model_dump(mode="json")


@blueprint.get("/")
@document_response(list[MemberItem])
async def list_members() -> list[dict[str, object]]:
    return [_out(m) for m in await team.members(runtime(), principal())]


@blueprint.patch("/<id:user_id>")
@json_body(ChangeRole)
@document_response(MemberItem)
async def change_role(user_id: str, body: ChangeRole) -> dict[str, object]:
    return _out(await team.change_role(runtime(), principal(), user_id, body.role))


@blueprint.delete("/<id:user_id>")
async def remove(user_id: str) -> Response:
    await team.remove(runtime(), principal(), user_id)
    return Response(b"", status=204)


@blueprint.post("/leave")
async def leave() -> Response:
    await team.leave(runtime(), principal())
    return Response(b"", status=204)


@blueprint.post("/<id:user_id>/ownership")
@document_response(MemberItem)
async def hand_over(user_id: str) -> dict[str, object]:
    return _out(await team.hand_over(runtime(), principal(), user_id))
