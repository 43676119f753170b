"""Destination policies: which limits apply to mail from one sending domain to one destination.

Pure functions over the rules (no I/O). A rule matches a recipient domain exactly
(`gmail.com`) or the destination's MX hosts by suffix (`*.google.com` matches
`gmail-smtp-in.l.google.com`). The limits of a recipient come from the matching rules in this
order, the first that sets a field giving it (`PRECEDENCE`):

1. the workspace's rules for the email's sending domain, then its rules for every sending
   domain; within each, an exact recipient domain before an MX suffix, a longer suffix first;
2. the built-in rules for the big mailbox providers (`BUILTIN`);
3. the default of `DEFAULT_CONNECTIONS` connections and no rate limit.

Operator caps (`Caps`, from settings) bound every result: connections and messages per
connection are clamped, and rate caps count on their own, across every workspace.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import date, datetime, timedelta

from engine.platform.settings import Caps
from storage.delivery_policies import Ramp, Rule

DEFAULT_CONNECTIONS = 4  # per destination across every node, when no rule says otherwise

PRECEDENCE = (
    "a rule for the sending domain before a rule for every sending domain of the workspace;"
    " within each, an exact recipient domain before an MX host suffix, a longer suffix first;"
    " then the built-in provider rules; each limit comes from the first rule that sets it"
)


def _builtin(name: str, match: str, connections: int, per_connection: int) -> Rule:
    return Rule(
        str(uuid.uuid5(uuid.NAMESPACE_URL, f"postroom:builtin-policy:{match}")),
        None,
        None,
        match,
        connections,
        per_connection,
        None,
        None,
        None,
        name=name,
    )


# Starting points from the providers' published guidance and common MTA shaping defaults:
# connection shaping only; rates depend on a sender's reputation, so they are the user's.
BUILTIN: tuple[Rule, ...] = (
    _builtin("Google (Gmail, Workspace)", "*.google.com", 10, 100),
    _builtin("Microsoft (Outlook.com, Hotmail, 365)", "*.outlook.com", 8, 100),
    _builtin("Yahoo and AOL", "*.yahoodns.net", 5, 20),
    _builtin("Apple iCloud", "*.icloud.com", 4, 50),
    _builtin("GMX and web.de", "*.gmx.net", 4, 50),
)


# Budget windows: each aligned to its unit (UTC days).
UNITS: dict[str, timedelta] = {
    "minute": timedelta(minutes=1),
    "hour": timedelta(hours=1),
    "day": timedelta(days=1),
}


def window_start(unit: str, now: datetime) -> datetime:
    """The start of the `unit` window `now` falls in."""
    if unit == "minute":
        return now.replace(second=0, microsecond=0)
    if unit == "hour":
        return now.replace(minute=0, second=0, microsecond=0)
    return now.replace(hour=0, minute=0, second=0, microsecond=0)


# Rates per minute and per hour are paced as well as counted: GCRA (the generic cell rate
# algorithm, as KumoMTA's throttles and ATM cells), one message every unit/amount with a burst
# of at most BURST, so 30 per minute sends about 10 in its first 20 s, not 30 at once, and
# never 60 within two seconds across a minute boundary. Daily budgets (caps, warm-up ramps)
# are volumes, not paces: counted per UTC day only.
PACED = ("minute", "hour")
BURST = 3


@dataclass(frozen=True, slots=True)
class Limit:
    """At most `amount` messages per `unit` window, counted under `key` by every node, and
    for a paced unit no faster than one per `interval` after a burst of `burst`."""

    key: str
    unit: str
    amount: int
    why: str  # for the throttled event: which rule or ramp
    # A ramp's budget grows by `growth` each window, and limits nothing from `ceiling` on.
    growth: float = 1.0
    ceiling: int | None = None

    @property
    def budget_key(self) -> str:
        return f"{self.key}/{self.unit}"

    @property
    def paced(self) -> bool:
        return self.unit in PACED

    @property
    def interval(self) -> timedelta:
        """The emission interval: the time one message takes of the rate."""
        return UNITS[self.unit] / self.amount

    @property
    def burst(self) -> int:
        return max(1, min(self.amount, BURST))

    def earliest(self, tat: datetime | None, now: datetime) -> datetime:
        """When the next message may go, given the budget's theoretical arrival time `tat`
        (None: nothing sent yet): `now` if it conforms."""
        if tat is None:
            return now
        return max(now, tat - (self.burst - 1) * self.interval)

    def after_one(self, tat: datetime | None, now: datetime) -> datetime:
        """The theoretical arrival time once one more message goes at `now`."""
        return max(now, tat or now) + self.interval

    def windows_until_room(self, waiting: int) -> int:
        """How many windows after this one until `waiting` (>= 0) messages already waiting
        for later windows, and one more, fit: 1 when the next window has room."""
        ahead, room = 0, 0
        while room <= waiting:
            ahead += 1
            try:
                amount = self.amount * self.growth**ahead
            except OverflowError:
                return ahead
            if self.ceiling is not None and amount >= self.ceiling:
                return ahead
            if self.growth == 1.0:  # the same every window: no need to count them one by one
                return ahead + (waiting - room) // self.amount
            room += int(amount)
        return ahead


@dataclass(frozen=True, slots=True)
class Effective:
    """What applies to one sending domain's mail to one destination."""

    connections: int
    per_connection: int | None
    limits: tuple[Limit, ...]
    # The rule `connections` comes from (None: the default); a workspace's own rule limits
    # that workspace's mail only (engine/delivery/throttle.py).
    connections_rule: Rule | None = None


def matches(rule: Rule, recipient_domain: str, mx_hosts: tuple[str, ...]) -> bool:
    suffix = rule.suffix
    if suffix is None:
        return rule.match == recipient_domain
    return any(host == suffix or host.endswith("." + suffix) for host in mx_hosts)


def _rank(rule: Rule, domain_id: str) -> tuple[int, int, int]:
    scope = 2 if rule.builtin else (0 if rule.domain_id == domain_id else 1)
    suffix = rule.suffix
    return (scope, 0 if suffix is None else 1, -len(suffix or ""))


def ordered(
    rules: list[Rule], domain_id: str, recipient_domain: str, mx_hosts: tuple[str, ...]
) -> list[Rule]:
    """The rules that apply to mail from `domain_id` to the destination, most specific first.

    `rules` are one workspace's (any sending domain); the built-in ones are added here.
    """
    applicable = [
        r
        for r in [*rules, *BUILTIN]
        if (r.domain_id is None or r.domain_id == domain_id)
        and matches(r, recipient_domain, mx_hosts)
    ]
    return sorted(applicable, key=lambda r: _rank(r, domain_id))


def destination_key(
    recipient_domain: str, mx_hosts: tuple[str, ...], patterns: list[str] | tuple[str, ...]
) -> str:
    """What connection slots, ramps and operator caps are counted under: `mx:<suffix>` for
    the longest MX suffix any rule (any workspace's, or built in) matches, so every domain
    hosted there shares one; else the recipient domain itself."""
    suffixes = {p[2:] for p in patterns if p.startswith("*.")} | {
        r.suffix for r in BUILTIN if r.suffix
    }
    found = [s for s in suffixes if any(host == s or host.endswith("." + s) for host in mx_hosts)]
    return f"mx:{max(found, key=len)}" if found else recipient_domain


def _first(rules: list[Rule], field: str) -> tuple[int, Rule] | None:
    for rule in rules:
        value = getattr(rule, field)
        if value is not None:
            return int(value), rule
    return None


def _clamp(value: int | None, cap: int | None) -> int | None:
    if cap is None:
        return value
    return cap if value is None else min(value, cap)


def effective(applicable: list[Rule], caps: Caps, destination: str) -> Effective:
    """The limits from `applicable` (most specific first), within the operator's caps."""
    found = _first(applicable, "max_connections")
    connections = DEFAULT_CONNECTIONS if found is None else found[0]
    per_connection = _first(applicable, "messages_per_connection")
    limits: list[Limit] = []
    for unit in UNITS:
        rate = _first(applicable, f"per_{unit}")
        if rate is not None:
            amount, rule = rate
            why = f"{amount} per {unit} ({'built-in' if rule.builtin else 'policy'} {rule.id})"
            limits.append(Limit(f"rule:{rule.id}", unit, amount, why))
        cap = getattr(caps, f"per_{unit}")
        if cap is not None:
            limits.append(Limit(f"cap:{destination}", unit, cap, f"{cap} per {unit} (operator)"))
    return Effective(
        connections=min(connections, caps.max_connections),
        per_connection=_clamp(
            None if per_connection is None else per_connection[0], caps.messages_per_connection
        ),
        limits=tuple(limits),
        connections_rule=None if found is None else found[1],
    )


def allowance(ramp: Ramp, day: date) -> int | None:
    """Messages per destination `ramp` allows on `day`; None once it has reached its target
    (warm-up is over: the ramp limits nothing)."""
    index = max(0, (day - ramp.starts_on).days)
    try:
        allowed = ramp.first_day * ramp.factor**index
    except OverflowError:  # years of growth: far past any target
        return None
    if allowed >= ramp.target_per_day:
        return None
    return int(allowed)


def ramp_limit(ramp: Ramp, day: date, destination: str) -> Limit | None:
    """The day's budget `ramp` sets for one destination (per provider), if any."""
    amount = allowance(ramp, day)
    if amount is None:
        return None
    why = f"{amount} per day (warm-up ramp {ramp.id}, day {(day - ramp.starts_on).days + 1})"
    return Limit(
        f"ramp:{ramp.id}:{destination}", "day", amount, why, ramp.factor, ramp.target_per_day
    )
