"""Numbers that say how mail is doing: delivery, bounce, complaint, open and click rates per
sending domain, tag or broadcast over a range, and one broadcast's figures.

Rates are over recipients: delivery and bounce over those whose mail had an outcome (sent),
complaint, open and click over those delivered. Opens and clicks count humans only; what
machines fetched (privacy proxies, link scanners: engine/sending/tracking.py) is shown beside
them and never in a rate. A rate without a denominator is None, not zero.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine import overview
from engine.platform.errors import NotFound
from engine.platform.runtime import Principal, Runtime
from storage import broadcasts, mail_stats
from storage.mail_stats import Counts, Grouping
from storage.tx import Tx

# The overview's ranges, so its chart and its rates cover the same mail.
RANGES = {name: spec[0] for name, spec in overview.RANGES.items()}
GROUPINGS: tuple[Grouping, ...] = ("domain", "tag", "broadcast")
HUMAN, MACHINE = "human", "machine"


def _rate(part: int, whole: int) -> float | None:
    return None if whole == 0 else round(part / whole, 4)


@dataclass(frozen=True, slots=True)
class Figures:
    """One group's recipients per outcome, and the rates they make."""

    sent: int
    delivered: int
    bounced: int
    complained: int
    opened: int
    clicked: int
    machine_opened: int
    machine_clicked: int

    @property
    def delivery_rate(self) -> float | None:
        return _rate(self.delivered, self.sent)

    @property
    def bounce_rate(self) -> float | None:
        return _rate(self.bounced, self.sent)

    @property
    def complaint_rate(self) -> float | None:
        return _rate(self.complained, self.delivered)

    @property
    def open_rate(self) -> float | None:
        return _rate(self.opened, self.delivered)

    @property
    def click_rate(self) -> float | None:
        return _rate(self.clicked, self.delivered)


def _figures(counts: Counts, group: str) -> Figures:
    def n(kind: str, audience: str = "") -> int:
        return counts.get((group, kind, audience), 0)

    # Opens and clicks recorded before they were classified count as human.
    return Figures(
        sent=n("sent"),
        delivered=n("delivered"),
        bounced=n("bounced"),
        complained=n("complained"),
        opened=n("opened", HUMAN) + n("opened"),
        clicked=n("clicked", HUMAN) + n("clicked"),
        machine_opened=n("opened", MACHINE),
        machine_clicked=n("clicked", MACHINE),
    )


@dataclass(frozen=True, slots=True)
class Rates:
    by: Grouping
    range: str
    since: datetime
    until: datetime
    groups: list[tuple[str, Figures]]  # (domain name, tag or broadcast id), most sent first
    names: dict[str, str]  # broadcast id -> its name, when grouped by broadcast


def _grouped(
    tx: Tx, workspace_id: str, by: Grouping, since: datetime, until: datetime
) -> tuple[Counts, dict[str, str]]:
    counts = mail_stats.grouped(tx, workspace_id, by, since, until)
    if by != "broadcast":
        return counts, {}
    ids = sorted({key[0] for key in counts})
    return counts, mail_stats.broadcast_names(tx, workspace_id, ids)


async def rates(rt: Runtime, who: Principal, by: Grouping, range_name: str) -> Rates:
    """The workspace's figures per `by` for its emails created in the last `range_name`."""
    until = rt.clock.now()
    since = until - RANGES[range_name]
    counts, names = await rt.db.read(_grouped, who.workspace_id, by, since, until)
    found = [(group, _figures(counts, group)) for group in {key[0] for key in counts}]
    found.sort(key=lambda item: (-item[1].sent, -item[1].delivered, item[0]))
    return Rates(by, range_name, since, until, found, names)


def _of_broadcast(tx: Tx, workspace_id: str, broadcast_id: str) -> Counts | None:
    if broadcasts.get(tx, workspace_id, broadcast_id) is None:
        return None
    return mail_stats.of_broadcast(tx, broadcast_id)


async def of_broadcast(rt: Runtime, who: Principal, broadcast_id: str) -> Figures:
    """One broadcast's figures over all its emails (NotFound if it is not the workspace's)."""
    counts = await rt.db.read(_of_broadcast, who.workspace_id, broadcast_id)
    if counts is None:
        raise NotFound("broadcast not found")
    return _figures(counts, broadcast_id)
