"""`/v1/smtp-credentials/`: relay credentials, one active per verified domain.

The password is in the create response only, with where to connect (the relay's smtp_host and
smtp_port, STARTTLS); the list shows every credential, deactivated ones with `is_active` false.
"""

from __future__ import annotations

from datetime import datetime
from uuid import UUID

from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body
from engine.accounts import smtp_credentials

blueprint = Blueprint("smtp_credentials", __name__, url_prefix="/v1/smtp-credentials")


class CreateSmtpCredential(In):
    domain_id: UUID


class SmtpCredentialCreated(Out):
    id: str
    username: str
    password: str
    smtp_host: str
    smtp_port: int
    created_at: datetime


class SmtpCredentialItem(Out):
    id: str
    username: str
    domain_id: str
    is_active: bool
    created_at: datetime


@blueprint.post("/")
@json_body(CreateSmtpCredential)
@document_response(SmtpCredentialCreated, 201)
async def create(body: CreateSmtpCredential) -> tuple[dict[str, object], int]:
    rt = runtime()
    created = await smtp_credentials.create(rt, principal(), str(body.domain_id))
    credential = created.credential
    out = SmtpCredentialCreated(
        id=credential.id,
        username=credential.username,
        password=created.password,
        smtp_host=rt.smtp_host,
        smtp_port=rt.smtp_port,
        created_at=credential.created_at,
    )
    return out.model_dump(mode="json"), 201


@blueprint.get("/")
@document_response(list[SmtpCredentialItem])
async def list_credentials() -> list[dict[str, object]]:
    found = await smtp_credentials.list_all(runtime(), principal())
    return [SmtpCredentialItem.model_validate(c).model_dump(mode="json") for c in found]


@blueprint.delete("/<id:credential_id>")
async def delete(credential_id: str) -> Response:
    await smtp_credentials.delete(runtime(), principal(), credential_id)
    return Response(b"", status=204)
