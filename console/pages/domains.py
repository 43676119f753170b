"""Domains: add one, the DNS records to publish (with copy buttons and each record's status),
verify now (or, in the sandbox, mark verified without DNS), the live bulk-sender report per
provider, resuming marketing mail the complaint-rate guard stopped, senders, tracking
switches and the domain's own tracking host, the bounce domain (each with its state), the SMTP credential (its password shown once), BIMI, and
transfer offers.
"""

from __future__ import annotations

from collections.abc import Awaitable
from typing import Any

from pydantic import BaseModel, Field
from quart import Blueprint, Response, request

from api.errors import status_of
from api.models import EmailText
from api.routes.domains import CreateDomain, UpdateDomain
from api.routes.senders import CreateSender
from console.web import form, go, page, parse, problems_of, rt, who
from engine import plans
from engine.accounts import smtp_credentials
from engine.contacts import complaint_guard
from engine.domains import (
    bimi,
    bounce_domain,
    provider_rules,
    registry,
    senders,
    spf,
    tracking_host,
)
from engine.platform.errors import EngineError
from engine.sandbox import mode as sandbox
from engine.transfers import actions as transfers
from engine.transfers.actions import AcceptRequest

blueprint = Blueprint("domains", __name__)

DONE = {
    "created": "Domain added.",
    "verified": "Checked the DNS records.",
    "sandbox": "Marked verified by the sandbox, without DNS.",
    "tracking": "Tracking settings saved.",
    "bounce_domain": "Bounce domain saved: publish its records, then verify.",
    "sender": "Sender added.",
    "sender_deleted": "Sender removed.",
    "credential_deleted": "SMTP credential deleted.",
    "logo": "BIMI logo uploaded.",
    "bimi": "BIMI enabled.",
    "offered": "Transfer offered: the recipient was mailed an accept link.",
    "cancelled": "Transfer offer cancelled.",
    "accepted": "Transfer accepted.",
    "declined": "Transfer declined.",
    "deleted": "Domain deleted.",
    "marketing_resumed": "Marketing mail resumed: what was held goes now.",
}
SANDBOX_SENDER = "hello"


class Offer(BaseModel):
    target_email: EmailText
    note: str = Field("", max_length=500)


async def _list(status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    found = await registry.list_all(runtime, principal)
    incoming = await transfers.incoming(runtime, principal) if runtime.domain_transfers else []
    state = await sandbox.state(runtime, principal)
    extra.setdefault("values", {})
    extra.setdefault("problems", {})
    return await page(
        "domains.html",
        status=status,
        title="Domains",
        domains=found,
        incoming=incoming,
        sandboxed=state.enabled,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/domains")
async def index() -> Response:
    return await _list()


@blueprint.post("/domains")
async def create() -> Response:
    values = await form()
    # The form's sandbox_verify is the console's own choice, no field of the API's body.
    body, problems = parse(CreateDomain, {"name": values.get("name", "")})
    if body is None:
        return await _list(422, values=values, problems=problems)
    runtime, principal = rt(), who()
    try:
        domain = await registry.create(runtime, principal, body.name)
        if values.get("sandbox_verify"):
            await sandbox.mark_verified(runtime, principal, domain.id)
            await senders.create(runtime, principal, f"{SANDBOX_SENDER}@{domain.name}", None)
    except EngineError as exc:
        return await _list(status_of(exc), values=values, problems={"name": exc.detail})
    return go("console.domains.detail", domain_id=domain.id, done="created")


async def _detail(domain_id: str, status: int = 200, **extra: Any) -> Response:
    runtime, principal = rt(), who()
    domain = await registry.get(runtime, principal, domain_id)
    all_senders = await senders.list_all(runtime, principal)
    credentials = [
        c for c in await smtp_credentials.list_all(runtime, principal) if c.domain_id == domain.id
    ]
    bimi_status = None
    if plans.plan(principal.plan).bimi:
        bimi_status = await bimi.status(runtime, principal, domain.id)
    offers = []
    if runtime.domain_transfers:
        offers = [
            t for t in await transfers.outgoing(runtime, principal) if t.domain_id == domain.id
        ]
    state = await sandbox.state(runtime, principal)
    extra.setdefault("problems", {})
    extra.setdefault("notice", DONE.get(request.args.get("done", "")))
    return await page(
        "domain.html",
        status=status,
        title=domain.name,
        domain=domain,
        records=registry.dns_records(
            domain, runtime.smtp_host, spf.recommended(runtime), runtime.public_url
        ),
        report=await provider_rules.report_on(runtime, domain),
        senders=[s for s in all_senders if s.domain_id == domain.id],
        credentials=credentials,
        bimi=bimi_status,
        offers=offers,
        transfers_on=runtime.domain_transfers,
        sandboxed=state.enabled,
        sandbox_verified=domain.name in state.sandbox_verified_domains,
        tracking_state=domain.record_status.get(tracking_host.PURPOSE, registry.PENDING),
        bounce_in_use=bounce_domain.in_use(domain),
        **extra,
    )


@blueprint.get("/domains/<id:domain_id>")
async def detail(domain_id: str) -> Response:
    return await _detail(domain_id)


async def _act(domain_id: str, action: Awaitable[Any], done: str) -> Response:
    """Run an action on the domain; back to its page, saying what happened or what failed."""
    try:
        await action
    except EngineError as exc:
        return await _detail(domain_id, status_of(exc), problems=problems_of(exc))
    return go("console.domains.detail", domain_id=domain_id, done=done)


@blueprint.post("/domains/<id:domain_id>/verify")
async def verify(domain_id: str) -> Response:
    return await _act(domain_id, registry.verify(rt(), who(), domain_id), "verified")


@blueprint.post("/domains/<id:domain_id>/sandbox-verify")
async def sandbox_verify(domain_id: str) -> Response:
    return await _act(domain_id, sandbox.mark_verified(rt(), who(), domain_id), "sandbox")


@blueprint.post("/domains/<id:domain_id>/tracking")
async def tracking(domain_id: str) -> Response:
    """Open and click tracking, and the domain's own tracking host, by the API's model (an
    empty host: links stay on the service's public URL)."""
    values = await form()
    body, problems = parse(
        UpdateDomain,
        {
            "open_tracking": bool(values.get("open_tracking")),
            "click_tracking": bool(values.get("click_tracking")),
            "tracking_host": values.get("tracking_host", "").strip() or None,
        },
    )
    if body is None:
        return await _detail(domain_id, 422, problems=problems)
    options = registry.MailOptions(tracking_host=body.tracking_host, set_tracking_host=True)
    action = registry.update(
        rt(), who(), domain_id, body.open_tracking, body.click_tracking, options
    )
    return await _act(domain_id, action, "tracking")


@blueprint.post("/domains/<id:domain_id>/bounce-domain")
async def set_bounce_domain(domain_id: str) -> Response:
    name = (await form()).get("bounce_domain", "").strip() or None
    action = bounce_domain.set_bounce_domain(rt(), who(), domain_id, name)
    return await _act(domain_id, action, "bounce_domain")


@blueprint.post("/domains/<id:domain_id>/marketing/resume")
async def resume_marketing(domain_id: str) -> Response:
    action = complaint_guard.resume_marketing(rt(), who(), domain_id)
    return await _act(domain_id, action, "marketing_resumed")


@blueprint.post("/domains/<id:domain_id>/senders")
async def add_sender(domain_id: str) -> Response:
    values = await form()
    body, problems = parse(CreateSender, values)
    if body is None:
        return await _detail(domain_id, 422, problems=problems, sender_values=values)
    return await _act(domain_id, senders.create(rt(), who(), body.email, body.name), "sender")


@blueprint.post("/domains/<id:domain_id>/senders/<id:sender_id>/delete")
async def delete_sender(domain_id: str, sender_id: str) -> Response:
    return await _act(domain_id, senders.delete(rt(), who(), sender_id), "sender_deleted")


@blueprint.post("/domains/<id:domain_id>/smtp-credential")
async def create_credential(domain_id: str) -> Response:
    try:
        created = await smtp_credentials.create(rt(), who(), domain_id)
    except EngineError as exc:
        return await _detail(domain_id, status_of(exc), problems=problems_of(exc))
    return await _detail(
        domain_id,
        created=created,
        smtp_host=rt().smtp_host,
        smtp_port=rt().smtp_port,
        notice="SMTP credential created: copy the password now, it is not shown again.",
    )


@blueprint.post("/domains/<id:domain_id>/smtp-credentials/<id:credential_id>/delete")
async def delete_credential(domain_id: str, credential_id: str) -> Response:
    action = smtp_credentials.delete(rt(), who(), credential_id)
    return await _act(domain_id, action, "credential_deleted")


@blueprint.post("/domains/<id:domain_id>/bimi/logo")
async def upload_logo(domain_id: str) -> Response:
    files = await request.files
    upload = files.get("file")
    if upload is None or not upload.filename:
        return await _detail(domain_id, 400, problems={"file": "choose an SVG file to upload"})
    content = upload.read(bimi.MAX_LOGO_BYTES + 1)
    action = bimi.upload_logo(rt(), who(), domain_id, upload.filename, content)
    return await _act(domain_id, action, "logo")


@blueprint.post("/domains/<id:domain_id>/bimi/enable")
async def enable_bimi(domain_id: str) -> Response:
    return await _act(domain_id, bimi.enable(rt(), who(), domain_id), "bimi")


@blueprint.post("/domains/<id:domain_id>/transfer")
async def offer(domain_id: str) -> Response:
    values = await form()
    body, problems = parse(Offer, values)
    if body is None:
        return await _detail(domain_id, 422, problems=problems, offer_values=values)
    action = transfers.initiate(rt(), who(), domain_id, body.target_email, body.note)
    return await _act(domain_id, action, "offered")


@blueprint.post("/domains/<id:domain_id>/transfers/<id:transfer_id>/cancel")
async def cancel_offer(domain_id: str, transfer_id: str) -> Response:
    return await _act(domain_id, transfers.cancel(rt(), who(), transfer_id), "cancelled")


@blueprint.post("/domain-transfers/<id:transfer_id>/accept")
async def accept(transfer_id: str) -> Response:
    values = await form()
    req = AcceptRequest(who(), None, rotate_dkim=bool(values.get("rotate_dkim")))
    try:
        await transfers.accept_by_id(rt(), transfer_id, req)
    except EngineError as exc:
        return await _list(status_of(exc), problems=problems_of(exc))
    return go("console.domains.index", done="accepted")


@blueprint.post("/domain-transfers/<id:transfer_id>/decline")
async def decline(transfer_id: str) -> Response:
    try:
        await transfers.decline(rt(), who(), transfer_id)
    except EngineError as exc:
        return await _list(status_of(exc), problems=problems_of(exc))
    return go("console.domains.index", done="declined")


@blueprint.post("/domains/<id:domain_id>/delete")
async def delete(domain_id: str) -> Response:
    try:
        await registry.delete(rt(), who(), domain_id)
    except EngineError as exc:
        return await _detail(domain_id, status_of(exc), problems=problems_of(exc))
    return go("console.domains.index", done="deleted")
