"""`/v1/workspace/invitations`: invite by email with a role (one mail with a one-time link),
list the pending ones, revoke; the invitee accepts signed in, or creates an account."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, public, runtime
from api.models import EmailText, In, Out
from api.validation import json_body
from engine import team

blueprint = Blueprint("invitations", __name__, url_prefix="/v1/workspace/invitations")


class Invite(In):
    email: EmailText
    role: Literal["admin", "developer", "viewer"]


class InvitationItem(Out):
    id: str
    email: str
    role: str
    invited_by: str
    created_at: datetime
    expires_at: datetime


class Accept(In):
    token: str = Field(min_length=1, max_length=200)


class SignUp(In):
    token: str = Field(min_length=1, max_length=200)
    password: str = Field(min_length=1, max_length=1000)


class Joined(Out):
    workspace_id: str


def _out(invitation: object) -> dict[str, object]:
    return InvitationItem.model_validate(invitation).model_dump(mode="json")


@blueprint.post("/")
@json_body(Invite)
@document_response(InvitationItem, 201)
async def invite(body: Invite) -> tuple[dict[str, object], int]:
    return _out(await team.invite(runtime(), principal(), body.email, body.role)), 201


@blueprint.get("/")
@document_response(list[InvitationItem])
async def list_invitations() -> list[dict[str, object]]:
    return [_out(i) for i in await team.pending(runtime(), principal())]


@blueprint.delete("/<id:invitation_id>")
async def revoke(invitation_id: str) -> Response:
    await team.revoke(runtime(), principal(), invitation_id)
    return Response(b"", status=204)


@blueprint.post("/accept")
@json_body(Accept)
@document_response(Joined)
async def accept(body: Accept) -> dict[str, object]:
    workspace_id = await team.accept(runtime(), principal(), body.token)
    return Joined(workspace_id=workspace_id).model_dump(mode="json")


@blueprint.post("/by-id/<id:invitation_id>/accept")
@document_response(Joined)
async def accept_by_id(invitation_id: str) -> dict[str, object]:
    """Accept an invitation addressed to the signed-in user's email, without its link."""
    workspace_id = await team.accept(runtime(), principal(), None, invitation_id)
    return Joined(workspace_id=workspace_id).model_dump(mode="json")


@blueprint.post("/sign-up")
@public
@json_body(SignUp)
@document_response(Joined, 201)
async def sign_up(body: SignUp) -> tuple[dict[str, object], int]:
    """Create the invitee's account and join; then sign in at /v1/auth/login."""
    workspace_id = await team.sign_up(runtime(), body.token, body.password)
    return Joined(workspace_id=workspace_id).model_dump(mode="json"), 201
