"""BIMI: status, logo upload and enabling per domain, and the public logo.

The public logo is served from the API's origin, where a session cookie lives: besides the
upload check (engine.svg_policy), its headers forbid it to run anything or load anything,
should a browser open it as a document.
"""

from __future__ import annotations

from pydantic import BaseModel
from quart import Blueprint, Response, request
from quart_schema import document_response

from api.auth import principal, public, runtime
from engine.domains import bimi
from engine.platform.errors import InvalidRequest

blueprint = Blueprint("bimi", __name__, url_prefix="/v1")

LOGO_HEADERS = {
    "Cache-Control": "public, max-age=86400",
    "Access-Control-Allow-Origin": "*",
    "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; sandbox",
    "X-Content-Type-Options": "nosniff",
}


class BimiStatusOut(BaseModel):
    domain: str
    domain_verified: bool
    bimi_svg_url: str | None
    bimi_vmc_url: str | None
    bimi_enabled: bool
    bimi_dns_record: str
    bimi_dns_host: str
    dmarc_upgrade_record: str | None


class LogoUploaded(BaseModel):
    url: str
    size: int
    bimi_dns_record: str
    bimi_dns_host: str


class Enabled(BaseModel):
    detail: str
    bimi_dns_record: str


@blueprint.get("/domains/<id:domain_id>/bimi/status")
@document_response(BimiStatusOut)
async def status(domain_id: str) -> dict[str, object]:
    found = await bimi.status(runtime(), principal(), domain_id)
    return BimiStatusOut.model_validate(found, from_attributes=True).model_dump()


@blueprint.post("/domains/<id:domain_id>/bimi/logo")
@document_response(LogoUploaded)
async def upload(domain_id: str) -> dict[str, object]:
    files = await request.files
    upload = files.get("file")
    if upload is None:
        raise InvalidRequest("send the SVG as multipart/form-data field `file`", code="no_file")
    content = upload.read(bimi.MAX_LOGO_BYTES + 1)
    rt = runtime()
    domain = await bimi.upload_logo(rt, principal(), domain_id, upload.filename or "", content)
    return LogoUploaded(
        url=bimi.logo_url(rt, domain),
        size=len(content),
        bimi_dns_record=bimi.dns_record(rt, domain),
        bimi_dns_host=bimi.dns_host(domain),
    ).model_dump()


@blueprint.post("/domains/<id:domain_id>/bimi/enable")
@document_response(Enabled)
async def enable(domain_id: str) -> dict[str, object]:
    rt = runtime()
    domain = await bimi.enable(rt, principal(), domain_id)
    record = bimi.dns_record(rt, domain)
    return Enabled(
        detail=f"BIMI enabled; publish {record} at {bimi.dns_host(domain)}", bimi_dns_record=record
    ).model_dump()


@blueprint.get("/bimi/<id:domain_id>/logo.svg")
@public
async def logo(domain_id: str) -> Response:
    svg = await bimi.public_logo(runtime(), domain_id)
    return Response(svg, content_type="image/svg+xml", headers=LOGO_HEADERS)
