"""`/v1/domains/{id}/dmarc`: what the DMARC aggregate reports received for a domain say
(engine/forwarding/dmarc_reports.py), by reporting organisation and source address, and the
sources that are not the service sending as the domain, set beside the service's own delivery
log: per source address and day, the messages the reports counted and the recipients the
service delivered of the domain's mail that day (`service_delivered`). Mail a source sent on
a day the service delivered none of the domain's (`while_service_idle`) is not Postroom's.

Rates are fractions of messages (0 to 1, four decimals), null when no message was counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import date
from typing import Any, Literal

from pydantic import BaseModel
from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In
from api.validation import query_args
from engine.forwarding import dmarc_reports
from engine.forwarding.dmarc_reports import Source, SourceDay

blueprint = Blueprint("dmarc_reports", __name__, url_prefix="/v1/domains")


class DmarcQuery(In):
    range: Literal["24h", "7d", "30d", "90d"] = "7d"


class Rates(BaseModel):
    messages: int
    dkim_pass_rate: float | None
    spf_pass_rate: float | None
    dmarc_pass_rate: float | None


class SourceOut(Rates):
    org_name: str
    source_ip: str
    postroom: bool  # the address is one the service's mail leaves from


class SourceDayOut(BaseModel):
    day: date
    source_ip: str
    postroom: bool  # the address is one the service's mail leaves from
    messages: int  # what the reports counted from the address that day
    # Recipients of the domain's mail the service delivered that day (from any of its
    # sending addresses: delivery does not record which one the system chose).
    service_delivered: int


class OtherSourceOut(Rates):
    source_ip: str
    org_names: list[str]  # the organisations that saw mail from it
    # Its messages on days the service delivered none of the domain's mail: not Postroom's.
    while_service_idle: int


class DmarcSummary(Rates):
    domain_id: str
    range: str
    since: date  # the first report day counted (UTC)
    reports: int
    sources: list[SourceOut]  # most messages first
    other_sources: list[OtherSourceOut]  # not the service sending as the domain
    by_day: list[SourceDayOut]  # per day and source address, beside the delivery log


def _rate(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def _rates(sources: Sequence[Source]) -> dict[str, Any]:
    messages = sum(s.messages for s in sources)
    return {
        "messages": messages,
        "dkim_pass_rate": _rate(sum(s.dkim_pass for s in sources), messages),
        "spf_pass_rate": _rate(sum(s.spf_pass for s in sources), messages),
        "dmarc_pass_rate": _rate(sum(s.dmarc_pass for s in sources), messages),
    }


def _others(sources: Sequence[Source], days: Sequence[SourceDay]) -> list[OtherSourceOut]:
    by_ip: dict[str, list[Source]] = {}
    for source in sources:
        if not source.postroom:
            by_ip.setdefault(source.source_ip, []).append(source)
    idle: dict[str, int] = {}
    for d in days:
        if d.service_delivered == 0:
            idle[d.source_ip] = idle.get(d.source_ip, 0) + d.messages
    others = [
        OtherSourceOut(
            source_ip=ip,
            org_names=sorted({s.org_name for s in seen}),
            while_service_idle=idle.get(ip, 0),
            **_rates(seen),
        )
        for ip, seen in by_ip.items()
    ]
    return sorted(others, key=lambda o: (-o.messages, o.source_ip))


@blueprint.get("/<id:domain_id>/dmarc")
@query_args(DmarcQuery)
@document_response(DmarcSummary)
async def dmarc(domain_id: str, query: DmarcQuery) -> dict[str, Any]:
    found = await dmarc_reports.summary(runtime(), principal(), domain_id, query.range)
    summary = DmarcSummary(
        domain_id=domain_id,
        range=found.range,
        since=found.first_day,
        reports=found.reports,
        sources=[
            SourceOut(
                org_name=s.org_name, source_ip=s.source_ip, postroom=s.postroom, **_rates([s])
            )
            for s in found.sources
        ],
        other_sources=_others(found.sources, found.days),
        by_day=[
            SourceDayOut(
                day=d.day,
                source_ip=d.source_ip,
                postroom=d.postroom,
                messages=d.messages,
                service_delivered=d.service_delivered,
            )
            for d in found.days
        ],
        **_rates(found.sources),
    )
    return summary.model_dump(mode="json")
