"""`/v1/domains/{id}/compliance`: the domain judged now against the bulk-sender rules of
Gmail, Yahoo and Microsoft (engine/domains/provider_rules.py), per provider and requirement,
each with its status, what was found and what to do."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import Out
from engine.domains import provider_rules

blueprint = Blueprint("compliance", __name__, url_prefix="/v1/domains")

Status = Literal["pass", "warn", "fail"]


class ItemOut(Out):
    requirement: str  # spf, dkim, dmarc, bounce_domain, unsubscribe_https, tls, ptr, complaint_rate
    title: str
    rule: str  # the provider's own rule this answers
    required: bool  # false: the provider recommends it, and not meeting it is a warn
    status: Status
    evidence: str  # what was found
    action: str | None  # what to do; null when nothing is


class ProviderOut(Out):
    provider: str  # gmail, yahoo, microsoft
    name: str
    rules: str  # the provider's document the rules come from
    url: str
    status: Status  # the worst of its items
    items: list[ItemOut]


class ComplianceReport(Out):
    domain_id: str
    domain: str
    checked_at: datetime
    live: bool  # DNS answered in time; false: the DNS items are from the domain's last check
    status: Status  # the worst provider's
    providers: list[ProviderOut]


@blueprint.get("/<id:domain_id>/compliance")
@document_response(ComplianceReport)
async def report(domain_id: str) -> dict[str, object]:
    """The domain against Gmail, Yahoo and Microsoft bulk-sender rules, judged now.

    Each requirement of each provider is evaluated at the time of the request: the domain's
    DNS records are looked up again through the service's resolver (bounded in time; past
    it, `live` is false and the last check stands in), the reverse DNS of each sending
    address is looked up, and the domain's deliveries and complaints over the last 30 days
    are counted (the share that went over TLS, the complaint rate against 0.1% and 0.3%).
    Every item has a `status` (pass, warn or fail), the `evidence` found and the `action`
    to take; each provider's status is its worst item's.
    """
    found = await provider_rules.report(runtime(), principal(), domain_id)
    return ComplianceReport.model_validate(found).model_dump(mode="json")
