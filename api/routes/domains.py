"""`/v1/domains/`: register (DKIM key and DNS records), read, tracking settings and mail
options (Ed25519 signing, the tags header, the bounce domain), verify, delete. Every domain
read carries its `compliance`: whether it can send, and its verdict on each bulk-sender rule."""

from __future__ import annotations

from datetime import datetime

from pydantic import Field
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import json_body
from engine.contacts import complaint_guard
from engine.domains import bounce_domain, compliance, spf
from engine.domains import registry as domains
from storage.domains import Domain

blueprint = Blueprint("domains", __name__, url_prefix="/v1/domains")


class CreateDomain(In):
    name: str = Field(min_length=1, max_length=253)


class UpdateDomain(In):
    open_tracking: bool | None = None
    click_tracking: bool | None = None
    # Sign with Ed25519 beside RSA (RFC 8463); the first time makes the key and its record.
    ed25519_signing: bool | None = None
    # The header the domain's mail carries its tags in (e.g. "X-Tags"); null: tags stay
    # internal, as they are by default.
    tags_header: str | None = None
    # The subdomain its envelope sender goes on (e.g. "bounces.example.com"), so bounces and
    # complaints reach Postroom when the domain's mail is hosted elsewhere; null: none.
    bounce_domain: str | None = Field(None, min_length=1, max_length=253)
    # The domain's own host for its open and click links (a name under the domain, with a
    # CNAME to the service's host); null: links stay on the service's public URL.
    tracking_host: str | None = Field(default=None, max_length=253)


class DnsRecordOut(Out):
    type: str
    host: str
    value: str
    purpose: str
    required: bool
    status: str  # pending, verified, missing, invalid (engine/domains/findings.py)
    detail: str | None  # why the status, from the last check
    suggested_value: str | None  # the whole record to publish in place of the one there


class RuleOut(Out):
    rule: str  # spf, dkim, dmarc, unsubscribe_https, bounce_domain
    status: str  # pass, fail, pending
    reason: str


class DmarcOut(Out):
    host: str
    inherited: bool
    policy: str
    subdomain_policy: str
    adkim: str
    aspf: str
    pct: int
    rua: list[str]
    ruf: list[str]


class ComplianceOut(Out):
    can_send: bool  # the domain is verified
    bulk_sender_ready: bool  # every rule passes (Gmail, Yahoo and Microsoft bulk senders)
    rules: list[RuleOut]
    dmarc: DmarcOut | None  # the DMARC policy that applies, as parsed


class DomainOut(Out):
    id: str
    name: str
    status: str
    dns_records: list[DnsRecordOut]
    open_tracking: bool
    click_tracking: bool
    ed25519_signing: bool
    tags_header: str | None
    bounce_domain: str | None
    tracking_host: str | None
    marketing_stopped_at: datetime | None  # by the complaint-rate guard, until resumed
    created_at: datetime
    verified_at: datetime | None
    compliance: ComplianceOut


def render(domain: Domain) -> dict[str, object]:
    rt = runtime()
    records = domains.dns_records(domain, rt.smtp_host, spf.recommended(rt), rt.public_url)
    verdicts = compliance.evaluate(domain, compliance.inputs(rt, domain))
    out = DomainOut(
        id=domain.id,
        name=domain.name,
        status=domain.status,
        dns_records=[DnsRecordOut.model_validate(r) for r in records],
        open_tracking=domain.open_tracking,
        click_tracking=domain.click_tracking,
        ed25519_signing=domain.ed25519_signing,
        tags_header=domain.tags_header,
        bounce_domain=domain.bounce_domain,
        tracking_host=domain.tracking_host,
        marketing_stopped_at=domain.marketing_stopped_at,
        created_at=domain.created_at,
        verified_at=domain.verified_at,
        compliance=ComplianceOut.model_validate(verdicts),
    )
    return out.model_dump(mode="json")


@blueprint.post("/")
@json_body(CreateDomain)
@document_response(DomainOut, 201)
async def create(body: CreateDomain) -> tuple[dict[str, object], int]:
    return render(await domains.create(runtime(), principal(), body.name)), 201


@blueprint.get("/")
@document_response(list[DomainOut])
async def list_domains() -> list[dict[str, object]]:
    return [render(d) for d in await domains.list_all(runtime(), principal())]


@blueprint.get("/<id:domain_id>")
@document_response(DomainOut)
async def get(domain_id: str) -> dict[str, object]:
    return render(await domains.get(runtime(), principal(), domain_id))


@blueprint.patch("/<id:domain_id>")
@json_body(UpdateDomain)
@document_response(DomainOut)
async def update(domain_id: str, body: UpdateDomain) -> dict[str, object]:
    rt, who = runtime(), principal()
    given = body.model_fields_set
    new_bounce_domain = "bounce_domain" in given
    if new_bounce_domain and body.bounce_domain is not None:  # refused before anything changes
        await bounce_domain.check_name(rt, who, domain_id, body.bounce_domain)
    options = domains.MailOptions(
        body.ed25519_signing,
        body.tags_header,
        "tags_header" in given,
        body.tracking_host,
        "tracking_host" in given,
    )
    if given != {"bounce_domain"}:
        await domains.update(rt, who, domain_id, body.open_tracking, body.click_tracking, options)
    if new_bounce_domain:
        await bounce_domain.set_bounce_domain(rt, who, domain_id, body.bounce_domain)
    return render(await domains.get(rt, who, domain_id))


@blueprint.post("/<id:domain_id>/verify")
@document_response(DomainOut)
async def verify(domain_id: str) -> dict[str, object]:
    return render(await domains.verify(runtime(), principal(), domain_id))


@blueprint.delete("/<id:domain_id>")
async def delete(domain_id: str) -> Response:
    await domains.delete(runtime(), principal(), domain_id)
    return Response(b"", status=204)


@blueprint.post("/<id:domain_id>/marketing/resume")
@document_response(DomainOut)
async def resume_marketing(domain_id: str) -> dict[str, object]:
    """Let mail that offers unsubscribe go again after the complaint-rate guard stopped it."""
    return render(await complaint_guard.resume_marketing(runtime(), principal(), domain_id))
