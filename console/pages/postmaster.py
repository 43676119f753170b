"""The mail a domain's postmaster@ and abuse@ received that was no complaint Postroom could
read (engine/forwarding/postmaster.py): a list, newest first, and one message as it arrived
(what was kept of it)."""

from __future__ import annotations

from quart import Blueprint, Response, request

from console.web import page, rt, who
from engine.domains import registry
from engine.forwarding import postmaster

blueprint = Blueprint("postmaster", __name__)

PAGE_SIZE = 50


def _page_number() -> int:
    value = request.args.get("page", "0")
    return min(int(value), 10_000) if value.isdigit() else 0


@blueprint.get("/domains/<id:domain_id>/postmaster-mail")
async def index(domain_id: str) -> Response:
    runtime, principal = rt(), who()
    domain = await registry.get(runtime, principal, domain_id)
    number = _page_number()
    items, total = await postmaster.page(runtime, principal, domain_id, number, PAGE_SIZE)
    return await page(
        "postmaster_mail.html",
        title=f"Postmaster mail of {domain.name}",
        domain=domain,
        items=items,
        total=total,
        number=number,
        more=(number + 1) * PAGE_SIZE < total,
        kept=postmaster.KEPT_PER_WORKSPACE,
        kept_kib=postmaster.KEPT_OCTETS // 1024,
    )


@blueprint.get("/domains/<id:domain_id>/postmaster-mail/<id:mail_id>")
async def message(domain_id: str, mail_id: str) -> Response:
    runtime, principal = rt(), who()
    domain = await registry.get(runtime, principal, domain_id)
    mail = await postmaster.get(runtime, principal, domain_id, mail_id)
    return await page(
        "postmaster_message.html",
        title=mail.subject or "(no subject)",
        domain=domain,
        mail=mail,
        raw=mail.content.decode("utf-8", "replace"),
    )
