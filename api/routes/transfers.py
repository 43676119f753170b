"""Domain transfers: initiate on a domain, the incoming and outgoing lists, accept (by the
invitation's token or by id), decline, cancel, and stop with the stop token.

Accept by token and stop by token need no login: the token in the path is the credential.
A caller who does authenticate on accept must be the recipient (403 `wrong_recipient`).
"""

from __future__ import annotations

from datetime import datetime

from pydantic import Field
from quart import Blueprint, request
from quart_schema import document_request, document_response

from api.auth import credential_optional, optional_principal, principal, public, runtime
from api.models import EmailText, In, Out
from api.validation import json_body, parse_body
from engine.transfers import actions as transfers
from engine.transfers import rules as transfer_rules
from engine.transfers.actions import AcceptRequest
from storage.transfers import Transfer

blueprint = Blueprint("transfers", __name__, url_prefix="/v1")


class InitiateTransfer(In):
    target_email: EmailText
    note: str | None = Field(None, max_length=transfer_rules.NOTE_MAX)


class AcceptTransfer(In):
    target_org_id: str | None = Field(None, max_length=100)
    rotate_dkim: bool = False


class TransferOut(Out):
    id: str
    domain_id: str
    domain_name: str
    source_user_id: str
    source_org_id: str
    source_label: str
    target_email: str
    target_user_id: str | None
    target_org_id: str | None
    status: str
    note: str
    cooloff_until: datetime | None
    initiated_at: datetime
    accepted_at: datetime | None
    completed_at: datetime | None
    expires_at: datetime


class EligibilityOut(Out):
    can_accept: bool
    code: str | None
    message: str | None
    current_domains: int
    domain_limit: int


def render(transfer: Transfer) -> dict[str, object]:
    return TransferOut.model_validate(transfer).model_dump(mode="json")


async def _accept_body() -> AcceptTransfer:
    # Both fields are optional, so an empty body (or none) means the defaults.
    raw = await request.get_data(cache=False, as_text=False)
    return AcceptTransfer.model_validate({}) if not raw.strip() else parse_body(AcceptTransfer, raw)


@blueprint.post("/domains/<id:domain_id>/transfer")
@json_body(InitiateTransfer)
@document_response(TransferOut)
async def initiate(domain_id: str, body: InitiateTransfer) -> dict[str, object]:
    transfer = await transfers.initiate(
        runtime(), principal(), domain_id, body.target_email, body.note or ""
    )
    return render(transfer)


@blueprint.get("/domain-transfers/incoming")
@document_response(list[TransferOut])
async def incoming() -> list[dict[str, object]]:
    return [render(t) for t in await transfers.incoming(runtime(), principal())]


@blueprint.get("/domain-transfers/outgoing")
@document_response(list[TransferOut])
async def outgoing() -> list[dict[str, object]]:
    return [render(t) for t in await transfers.outgoing(runtime(), principal())]


@blueprint.get("/domain-transfers/accept-eligibility")
@document_response(EligibilityOut)
async def accept_eligibility() -> dict[str, object]:
    eligibility = await transfers.accept_eligibility(runtime(), principal())
    return EligibilityOut.model_validate(eligibility).model_dump(mode="json")


@blueprint.post("/domain-transfers/<token>/accept")
@credential_optional
@document_request(AcceptTransfer)
@document_response(TransferOut)
async def accept_by_token(token: str) -> dict[str, object]:
    body = await _accept_body()
    req = AcceptRequest(optional_principal(), body.target_org_id, body.rotate_dkim)
    return render(await transfers.accept_by_token(runtime(), token, req))


@blueprint.post("/domain-transfers/by-id/<id:transfer_id>/accept")
@document_request(AcceptTransfer)
@document_response(TransferOut)
async def accept_by_id(transfer_id: str) -> dict[str, object]:
    body = await _accept_body()
    req = AcceptRequest(principal(), body.target_org_id, body.rotate_dkim)
    return render(await transfers.accept_by_id(runtime(), transfer_id, req))


@blueprint.post("/domain-transfers/<id:transfer_id>/decline")
@document_response(TransferOut)
async def decline(transfer_id: str) -> dict[str, object]:
    return render(await transfers.decline(runtime(), principal(), transfer_id))


@blueprint.delete("/domain-transfers/<id:transfer_id>")
@document_response(TransferOut)
async def cancel(transfer_id: str) -> dict[str, object]:
    return render(await transfers.cancel(runtime(), principal(), transfer_id))


@blueprint.post("/domain-transfers/stop/<stop_token>")
@public
@document_response(TransferOut)
async def stop(stop_token: str) -> dict[str, object]:
    return render(await transfers.stop(runtime(), stop_token))
