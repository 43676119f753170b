"""When the last waiting message should leave, per destination (`GET /v1/delivery/forecast`).

The backlog (recipients queued or deferred) is grouped per destination, as delivery counts
it (engine/delivery/policies.py `destination_key`: every domain behind one provider's MX is
one destination), and per sending domain. For each group the limits that apply now (policies,
ramp, operator caps) with what their current windows have spent give the time the last
message fits a budget; the recent acceptance rate (recipients accepted among those tried in
the last hour) inflates the count, since a deferred attempt spends budget too. A group under
no rate limit is estimated from the pace at which its destination accepted mail in the last
hour, else as leaving now (connections are then the only bound). No group finishes before
the latest next attempt among its recipients: one deferred until later leaves no sooner.

Mail from an egress pool spreads over its sources by weight, and each source spends budgets
and counts ramp days of its own (engine/delivery/egress_sources.py): a group's mail is split
by the weights and each share forecast under its source's limits, operator caps over them all.

Each group is forecast on its own: two sending domains under one workspace-wide rule share
its budget, so their true finish can be later than either forecast says.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta

import trio

from engine.delivery import egress_sources, policies, throttle
from engine.delivery.policies import Limit
from engine.platform.runtime import Principal, Runtime
from storage import delivery_policies as stored
from storage import egress, sandbox
from storage.delivery_policies import Backlog, Ramp, Rule
from storage.egress import Source
from storage.tx import Tx

RESOLVED_DOMAINS = 50  # MX lookups per forecast: the biggest backlogs; others go by name
RECENT = timedelta(hours=1)
MIN_ACCEPTANCE = 0.05  # below this a destination is refusing us; the estimate is moot
RAMP_HORIZON = 3650  # days a ramp forecast looks ahead at most


@dataclass(frozen=True, slots=True)
class LimitState:
    unit: str
    amount: int
    used: int  # in the current window
    source: str


@dataclass(frozen=True, slots=True)
class DestinationForecast:
    destination: str
    provider: str | None  # the built-in provider policy that matches, if any
    sending_domain_id: str
    domains: list[str]
    waiting: int
    limits: list[LimitState]
    acceptance_rate: float | None
    last_leaves_at: datetime


@dataclass(frozen=True, slots=True)
class Forecast:
    generated_at: datetime
    waiting: int
    last_leaves_at: datetime | None
    destinations: list[DestinationForecast] = field(default_factory=list)


def _limit_finish(limit: Limit, used: int, waiting: int, now: datetime) -> datetime:
    """When the last of `waiting` messages fits `limit`, `used` spent in this window (and,
    for a paced rate, at its pace after a burst)."""
    paced = now + limit.interval * max(0, waiting - limit.burst) if limit.paced else now
    left = max(0, limit.amount - used)
    if waiting <= left:
        return paced
    window = policies.UNITS[limit.unit]
    start = policies.window_start(limit.unit, now)
    return max(paced, start + window * (1 + (waiting - left - 1) // limit.amount))


def _ramp_finish(ramp: Ramp, used_today: int, waiting: int, now: datetime) -> datetime:
    """When the last of `waiting` messages fits the ramp's daily allowances."""
    today = now.date()
    for day in range(RAMP_HORIZON):
        on = today + timedelta(days=day)
        allowed = policies.allowance(ramp, on)
        left = waiting if allowed is None else allowed - (used_today if day == 0 else 0)
        if waiting <= max(0, left):
            return now if day == 0 else _midnight(on, now)
        waiting -= max(0, left)
    return _midnight(today + timedelta(days=RAMP_HORIZON), now)


def _midnight(day: date, like: datetime) -> datetime:
    return like.replace(year=day.year, month=day.month, day=day.day, hour=0, minute=0, second=0)


def _used(limit: Limit, budgets: dict[str, tuple[datetime, int]], now: datetime) -> int:
    start, used = budgets.get(limit.budget_key, (now, 0))
    return used if start == policies.window_start(limit.unit, now) else 0


async def _hosts(rt: Runtime, backlog: list[Backlog]) -> dict[str, tuple[str, ...]]:
    """MX hosts of the biggest backlogs' domains, looked up side by side."""
    names = list(dict.fromkeys(b.recipient_domain for b in backlog))[:RESOLVED_DOMAINS]
    found: dict[str, tuple[str, ...]] = {}

    async def look(name: str) -> None:
        dest = await throttle.destination(rt, name)
        if dest is not None:
            found[name] = dest.mx_hosts

    async with trio.open_nursery() as nursery:
        for name in names:
            nursery.start_soon(look, name)
    return found


@dataclass(frozen=True, slots=True)
class _Lane:
    """The share of a group's mail one egress source takes (None: the default egress), the
    limits counted for it alone, and its ramp (as of the source's age) with today's budget."""

    source: Source | None
    share: float
    limits: list[Limit]
    ramp: Ramp | None
    ramp_today: Limit | None


@dataclass(frozen=True, slots=True)
class _Plan:
    caps: list[Limit]  # the operator's, shared by every source
    lanes: list[_Lane]
    provider: str | None

    def every_limit(self) -> list[Limit]:
        today = [lane.ramp_today for lane in self.lanes if lane.ramp_today is not None]
        return [*self.caps, *(lim for lane in self.lanes for lim in lane.limits), *today]


def _pools(
    tx: Tx, workspace_id: str, domain_ids: list[str]
) -> dict[str, list[tuple[Source | None, float]]]:
    """For each sending domain whose mail leaves from a pool, its sources and their shares."""
    assignments = egress.assignments_of(tx, [workspace_id], domain_ids)
    if not assignments:
        return {}
    pools = egress.pools_of(tx, assignments.values())
    sources = egress.sources_of(tx, (m.source_id for p in pools.values() for m in p.sources))
    found: dict[str, list[tuple[Source | None, float]]] = {}
    for domain_id in domain_ids:
        pool = pools.get(egress_sources.pool_for(workspace_id, domain_id, assignments) or "")
        shares = [] if pool is None else egress_sources.shares(pool, sources)
        if shares:
            found[domain_id] = list(shares)
    return found


def _state(
    limit: Limit,
    budgets: dict[str, tuple[datetime, int]],
    now: datetime,
    source: Source | None = None,
) -> LimitState:
    why = limit.why if source is None else f"{limit.why}, from egress source {source.name}"
    return LimitState(limit.unit, limit.amount, _used(limit, budgets, now), why)


@dataclass(slots=True)
class _Group:
    domains: list[str] = field(default_factory=list)
    hosts: tuple[str, ...] = ()
    waiting: int = 0
    next_attempt_at: datetime | None = None  # the latest among its recipients


async def forecast(
    rt: Runtime, who: Principal, within: tuple[str, datetime, datetime] | None = None
) -> Forecast:
    """The workspace's backlog forecast; `within`: one broadcast's emails (see
    storage/delivery_policies.py `backlog`)."""
    now = rt.clock.now()
    backlog = await rt.db.read(stored.backlog, who.workspace_id, within)
    # A sandboxed workspace's mail leaves by no MX, and asks no DNS (as its delivery does):
    # it is grouped by recipient domain, as mail whose MX is not known.
    sandboxed = await rt.db.read(sandbox.is_sandboxed, who.workspace_id)
    hosts = {} if sandboxed else await _hosts(rt, backlog)

    def context(tx: Tx) -> tuple[list[str], list[Rule], dict[tuple[str, str], Ramp]]:
        return (
            stored.suffix_patterns(tx),
            stored.rules_of(tx, [who.workspace_id])[who.workspace_id],
            stored.ramps_of(tx, [who.workspace_id]),
        )

    patterns, rules, ramps = await rt.db.read(context)
    groups: dict[tuple[str, str], _Group] = defaultdict(_Group)
    for item in backlog:
        mx_hosts = hosts.get(item.recipient_domain, (item.recipient_domain,))
        key = policies.destination_key(item.recipient_domain, mx_hosts, patterns)
        group = groups[(key, item.domain_id)]
        if not group.domains:
            group.hosts = mx_hosts
        group.domains.append(item.recipient_domain)
        group.waiting += item.waiting
        if item.next_attempt_at is not None:
            group.next_attempt_at = max(group.next_attempt_at or now, item.next_attempt_at)
    pooled = await rt.db.read(_pools, who.workspace_id, [domain_id for _, domain_id in groups])
    plans: dict[tuple[str, str], _Plan] = {}
    for (key, domain_id), group in groups.items():
        applicable = policies.ordered(rules, domain_id, group.domains[0], group.hosts)
        limits = policies.effective(applicable, rt.delivery_caps, key).limits
        ramp = ramps.get((who.workspace_id, domain_id))
        # Mail from a pool spreads over its sources by weight, each with budgets and a ramp
        # day of its own (engine/delivery/egress_sources.py); operator caps bind them all.
        lanes = []
        for source, share in pooled.get(domain_id) or [(None, 1.0)]:
            own = [egress_sources.counted_for(lim, source) for lim in limits]
            ramp_now = None if ramp is None else egress_sources.ramp_of(ramp, source)
            today = None if ramp_now is None else policies.ramp_limit(ramp_now, now.date(), key)
            lanes.append(
                _Lane(
                    source,
                    share,
                    [lim for lim in own if not lim.key.startswith("cap:")],
                    ramp_now,
                    None if today is None else egress_sources.counted_for(today, source),
                )
            )
        caps = [lim for lim in limits if lim.key.startswith("cap:")]
        provider = next((r.name for r in applicable if r.builtin), None)
        plans[(key, domain_id)] = _Plan(caps, lanes, provider)
    budget_keys = [lim.budget_key for plan in plans.values() for lim in plan.every_limit()]

    def state(
        tx: Tx,
    ) -> tuple[dict[str, tuple[datetime, int]], dict[str, tuple[int, int]]]:
        return (
            stored.read_budgets(tx, budget_keys),
            stored.recent_outcomes(tx, who.workspace_id, now - RECENT),
        )

    budgets, outcomes = await rt.db.read(state)
    found = []
    for (key, domain_id), group in groups.items():
        plan = plans[(key, domain_id)]
        ok = sum(outcomes.get(d, (0, 0))[0] for d in group.domains)
        tried = ok + sum(outcomes.get(d, (0, 0))[1] for d in group.domains)
        acceptance = ok / tried if tried else None
        # Every attempt spends budget, accepted or not.
        spending = math.ceil(group.waiting / max(acceptance or 1.0, MIN_ACCEPTANCE))
        finishes = [
            _limit_finish(lim, _used(lim, budgets, now), spending, now) for lim in plan.caps
        ]
        states = [_state(lim, budgets, now) for lim in plan.caps]
        for lane in plan.lanes:
            share = math.ceil(spending * lane.share)
            finishes += [
                _limit_finish(lim, _used(lim, budgets, now), share, now) for lim in lane.limits
            ]
            states += [_state(lim, budgets, now, lane.source) for lim in lane.limits]
            if lane.ramp is not None:
                today = lane.ramp_today
                used = 0 if today is None else _used(today, budgets, now)
                finishes.append(_ramp_finish(lane.ramp, used, share, now))
                if today is not None:
                    states.append(_state(today, budgets, now, lane.source))
        if not finishes and ok:
            # No budget to go by: the pace the destination took our mail at lately.
            finishes.append(now + RECENT * (spending / ok))
        if group.next_attempt_at is not None:
            finishes.append(group.next_attempt_at)
        found.append(
            DestinationForecast(
                destination=key,
                provider=plan.provider,
                sending_domain_id=domain_id,
                domains=group.domains[:20],
                waiting=group.waiting,
                limits=states,
                acceptance_rate=None if acceptance is None else round(acceptance, 3),
                last_leaves_at=max(finishes, default=now),
            )
        )
    found.sort(key=lambda f: (f.last_leaves_at, f.waiting), reverse=True)
    return Forecast(
        generated_at=now,
        waiting=sum(f.waiting for f in found),
        last_leaves_at=max((f.last_leaves_at for f in found), default=None),
        destinations=found,
    )
