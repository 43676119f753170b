"""Platform-admin endpoints: the force transfer of a domain.

Only for users with `is_admin`, in a session re-authenticated within the last five minutes
(`POST /v1/auth/reauth`); an API key cannot re-authenticate, so it is always refused.
"""

from __future__ import annotations

from quart import Blueprint, g
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In
from api.routes.transfers import TransferOut, render
from api.validation import json_body
from engine.transfers import actions as transfers
from engine.transfers.actions import ForceRequest

blueprint = Blueprint("admin", __name__, url_prefix="/v1/admin")


class ForceTransfer(In):
    target_email: EmailText
    rotate_dkim: bool = True


@blueprint.post("/domain-transfers/<id:domain_id>")
@json_body(ForceTransfer)
@document_response(TransferOut)
async def force_transfer(domain_id: str, body: ForceTransfer) -> dict[str, object]:
    req = ForceRequest(
        principal(),
        g.get("reauthenticated_until"),
        domain_id,
        body.target_email,
        body.rotate_dkim,
    )
    return render(await transfers.force(runtime(), req))
