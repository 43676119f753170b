"""`/v1/auth/totp/`: two-factor sign-in (engine/accounts/totp.py). Enrol, confirm with a first
code (the recovery codes are in that answer only), turn it off, the login's second step, and a
workspace owner requiring it of every member.

A password login of a user with two-factor sign-in answers 202 with a pending-login token
(api/routes/sessions.py); `POST /v1/auth/totp/login` takes it with a code and sets the session
cookie. Codes are counted against the password-guessing limits.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, model_validator
from quart import Blueprint, Response, jsonify
from quart_schema import document_response

from api.auth import principal, public, runtime, set_session_cookie
from api.models import In, Out
from api.routes.sessions import LoginOut, client_address, login_out
from api.validation import json_body
from engine.accounts import totp

blueprint = Blueprint("totp", __name__, url_prefix="/v1/auth/totp")

# A TOTP code is six digits; a recovery code `abcd-ef01-2345-6789` (dashes optional).
CODE_MIN, CODE_MAX = 6, 40


class StatusOut(Out):
    enabled: bool
    enrolling: bool
    recovery_codes_left: int
    required: bool


class EnrolmentOut(Out):
    secret: str
    otpauth_uri: str


class CodeIn(In):
    code: str = Field(min_length=CODE_MIN, max_length=CODE_MAX)


class RecoveryCodesOut(Out):
    recovery_codes: list[str]


class DisableIn(In):
    """Proof that the person at the keyboard is the account's: a current code or the password."""

    code: str | None = Field(None, min_length=CODE_MIN, max_length=CODE_MAX)
    password: str | None = Field(None, min_length=1, max_length=1024)

    @model_validator(mode="after")
    def one_proof(self) -> Self:
        if (self.code is None) == (self.password is None):
            raise ValueError("send either `code` or `password`")
        return self


class SecondStepIn(In):
    pending_token: str = Field(min_length=1, max_length=2048)
    code: str = Field(min_length=CODE_MIN, max_length=CODE_MAX)


class RequirementIn(In):
    required: bool


def _status(found: totp.Status) -> dict[str, object]:
    return StatusOut.model_validate(found).model_dump(mode="json")


@blueprint.get("/")
@document_response(StatusOut)
async def status() -> dict[str, object]:
    return _status(await totp.status(runtime(), principal()))


@blueprint.post("/enrol")
@document_response(EnrolmentOut)
async def enrol() -> dict[str, object]:
    made = await totp.enrol(runtime(), principal())
    return EnrolmentOut(secret=made.secret, otpauth_uri=made.uri).model_dump(mode="json")


@blueprint.post("/confirm")
@json_body(CodeIn)
@document_response(RecoveryCodesOut)
async def confirm(body: CodeIn) -> dict[str, object]:
    codes = await totp.confirm(runtime(), principal(), body.code, client_address())
    return RecoveryCodesOut(recovery_codes=codes).model_dump(mode="json")


@blueprint.post("/disable")
@json_body(DisableIn)
async def disable(body: DisableIn) -> Response:
    await totp.disable(
        runtime(), principal(), code=body.code, password=body.password, client=client_address()
    )
    return Response(b"", status=204)


@blueprint.post("/login")
@public
@json_body(SecondStepIn)
@document_response(LoginOut)
async def login(body: SecondStepIn) -> Response:
    rt = runtime()
    session = await totp.finish_login(rt, body.pending_token, body.code, client_address())
    response = jsonify(login_out(session))
    set_session_cookie(response, rt, session)
    return response


@blueprint.put("/requirement")
@json_body(RequirementIn)
@document_response(StatusOut)
async def set_requirement(body: RequirementIn) -> dict[str, object]:
    rt, who = runtime(), principal()
    await totp.set_required(rt, who, body.required)
    return _status(await totp.status(rt, who))
