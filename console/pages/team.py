"""The Team page: members and their roles, the invite form and pending invitations, removing,
leaving and handing the workspace over; and the page an invitation link opens, where the
invitee joins signed in or creates an account. The rules are engine/team.py's."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response, request

from api.auth import set_session_cookie
from api.errors import status_of
from api.routes.invitations import Invite
from api.routes.members import ChangeRole
from api.routes.sessions import client_address
from console.web import WORKSPACE_COOKIE, form, go, page, parse, problems_of, public, rt, who
from engine import team
from engine.accounts import roles, users
from engine.platform.errors import EngineError
from engine.team import GRANTABLE

blueprint = Blueprint("team", __name__)

_DONE = {
    "invited": "Invitation sent.",
    "revoked": "Invitation revoked: its link no longer works.",
    "role": "Role changed.",
    "removed": "Member removed: they lost the workspace at once.",
    "handed": "You handed the workspace over; you are an admin now.",
}


async def _index(status: int = 200, **extra: Any) -> Response:
    me = who()
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "team.html",
        status=status,
        title="Team",
        members=await team.members(rt(), me),
        invitations=await team.pending(rt(), me),
        offers=await team.offers(rt(), me),
        manages=roles.may(me.role, roles.MEMBERS),
        owns=roles.may(me.role, roles.OWNERSHIP),
        grantable=GRANTABLE,
        notice=_DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/team")
async def index() -> Response:
    return await _index()


@blueprint.post("/team/invitations")
async def invite() -> Response:
    values = await form()
    body, problems = parse(Invite, {"email": values.get("email", ""), "role": values.get("role")})
    if body is None:
        return await _index(422, values=values, problems=problems)
    try:
        await team.invite(rt(), who(), body.email, body.role)
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.team.index", done="invited")


@blueprint.post("/team/invitations/<id:invitation_id>/revoke")
async def revoke(invitation_id: str) -> Response:
    await team.revoke(rt(), who(), invitation_id)
    return go("console.team.index", done="revoked")


@blueprint.post("/team/members/<id:user_id>/role")
async def change_role(user_id: str) -> Response:
    body, problems = parse(ChangeRole, {"role": (await form()).get("role")})
    if body is None:
        return await _index(422, problems=problems)
    await team.change_role(rt(), who(), user_id, body.role)
    return go("console.team.index", done="role")


@blueprint.post("/team/members/<id:user_id>/remove")
async def remove(user_id: str) -> Response:
    await team.remove(rt(), who(), user_id)
    return go("console.team.index", done="removed")


@blueprint.post("/team/members/<id:user_id>/hand-over")
async def hand_over(user_id: str) -> Response:
    await team.hand_over(rt(), who(), user_id)
    return go("console.team.index", done="handed")


@blueprint.post("/team/offers/<id:invitation_id>/accept")
async def accept_by_id(invitation_id: str) -> Response:
    workspace_id = await team.accept(rt(), who(), None, invitation_id)
    return _enter(workspace_id, go("console.overview.index"))


@blueprint.post("/team/leave")
async def leave() -> Response:
    await team.leave(rt(), who())
    response = go("console.overview.index")
    response.delete_cookie(WORKSPACE_COOKIE, path="/")
    return response


# The invitation link.


class SignUp(BaseModel):
    password: str = Field(min_length=users.MIN_PASSWORD_LENGTH, max_length=1024)


async def _invitation(token: str, status: int = 200, **extra: Any) -> Response:
    try:
        found = await team.view(rt(), token)
    except EngineError as exc:
        return await page("error.html", status=status_of(exc), detail=exc.detail, code=exc.code)
    extra.setdefault("problems", {})
    return await page(
        "invitation.html", status=status, title="Invitation", found=found, token=token, **extra
    )


@blueprint.get("/invitations/<token>")
@public
async def invitation(token: str) -> Response:
    return await _invitation(token)


def _enter(workspace_id: str, response: Response) -> Response:
    response.set_cookie(WORKSPACE_COOKIE, workspace_id, httponly=True, samesite="Lax", path="/")
    return response


@blueprint.post("/invitations/<token>/sign-up")
@public
async def sign_up(token: str) -> Response:
    body, problems = parse(SignUp, {"password": (await form()).get("password", "")})
    if body is None:
        return await _invitation(token, 422, problems=problems)
    try:
        email = (await team.view(rt(), token)).invitation.email
        workspace_id = await team.sign_up(rt(), token, body.password)
        session = await users.login(rt(), email, body.password, client_address())
    except EngineError as exc:
        return await _invitation(token, status_of(exc), problems=problems_of(exc))
    if not isinstance(session, users.LoggedIn):  # a new account has no second factor
        return go("console.auth.login")
    response = _enter(workspace_id, go("console.overview.index"))
    set_session_cookie(response, rt(), session)
    return response


@blueprint.post("/invitations/<token>/accept")
async def accept(token: str) -> Response:
    try:
        workspace_id = await team.accept(rt(), who(), token)
    except EngineError as exc:
        return await _invitation(token, status_of(exc), problems=problems_of(exc))
    return _enter(workspace_id, go("console.overview.index"))
