"""`/v1/verify`: check an address by syntax, MX and an SMTP probe (the sandbox's answer in a
sandboxed workspace); nothing is sent."""

from __future__ import annotations

from pydantic import BaseModel, Field
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import json_body
from engine.sandbox import probes

blueprint = Blueprint("verify", __name__, url_prefix="/v1/verify")


class VerifyBody(In):
    email: str = Field(min_length=1, max_length=320)


class VerificationOut(BaseModel):
    email: str
    result: str
    reason: str
    mx_found: bool
    mx_host: str | None


@blueprint.post("")
@json_body(VerifyBody)
@document_response(VerificationOut)
async def verify(body: VerifyBody) -> dict[str, object]:
    checked = await probes.verify(runtime(), principal(), body.email)
    return VerificationOut(
        email=checked.email,
        result=checked.result,
        reason=checked.reason,
        mx_found=checked.mx_found,
        mx_host=checked.mx_host,
    ).model_dump()
