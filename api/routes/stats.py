"""`/v1/stats/rates`: delivery, bounce, complaint, open and click rates of the workspace's
mail per sending domain, tag or broadcast over a range (engine/mail_stats.py). One
broadcast's figures are `/v1/broadcasts/{id}/stats` (api/routes/broadcasts.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from quart import Blueprint
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Out
from api.validation import query_args
from engine import mail_stats
from engine.mail_stats import Figures

blueprint = Blueprint("stats", __name__, url_prefix="/v1/stats")


class RatesQuery(In):
    by: Literal["domain", "tag", "broadcast"] = "domain"
    range: Literal["24h", "7d", "30d"] = "7d"


class FiguresOut(Out):
    """Recipients per outcome, and rates as fractions (null without a denominator)."""

    sent: int  # recipients whose mail had an outcome: delivered, bounced or failed
    delivered: int
    bounced: int
    complained: int
    opened: int  # by a person
    clicked: int  # by a person
    machine_opened: int  # privacy proxies and scanners: in no rate
    machine_clicked: int
    delivery_rate: float | None  # delivered / sent
    bounce_rate: float | None  # bounced / sent
    complaint_rate: float | None  # complained / delivered
    open_rate: float | None  # opened / delivered
    click_rate: float | None  # clicked / delivered


class GroupOut(FiguresOut):
    key: str  # the domain's name, the tag, or the broadcast's id


class RatesOut(Out):
    by: str
    range: str
    since: datetime
    until: datetime
    groups: list[GroupOut]


def figures(found: Figures, **extra: str) -> dict[str, object]:
    """The figures as the API shows them."""
    fields = {name: getattr(found, name) for name in FiguresOut.model_fields}
    return fields | extra


@blueprint.get("/rates")
@query_args(RatesQuery)
@document_response(RatesOut)
async def rates(query: RatesQuery) -> dict[str, object]:
    found = await mail_stats.rates(runtime(), principal(), query.by, query.range)
    groups = [figures(f, key=key) for key, f in found.groups]
    return RatesOut.model_validate(
        {"by": found.by, "range": found.range, "since": found.since, "until": found.until}
        | {"groups": groups}
    ).model_dump(mode="json")
