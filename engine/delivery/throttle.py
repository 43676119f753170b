"""A delivery round's claim under the destination policies and warm-up ramps.

Runs inside the round's claim transaction (one unit of work), so the limits hold across
every node: the round leases its due recipients, works out what applies to each sending
domain's mail (engine/delivery/policies.py), takes connection slots for the destination up
to the largest connection limit among them (storage/destination_slots.py, keyed by the
destination so every domain behind one MX group shares them), then spends the rate budgets
(storage/delivery_policies.py rows, locked in key order) recipient by recipient.

A workspace's policies shape its own mail only: mail under a lower connection limit than
the round's keeps only as many emails (each one connection at most) as that limit leaves
free, counting, for a workspace's own rule, its emails other rounds hold at this domain on
any node; the rest is given back untouched for a later round. So one tenant's
`max_connections: 1` never makes everyone's mail to that destination go one at a time.
Operator caps are in every limit, so they bound all the mail.

A recipient that does not fit a budget waits: it becomes `deferred` with reason `throttled`
and a next attempt at the start of the window where its budget returns (later ones of the
same round one window further per budget-full), with one `deferred` event the first time.
Waiting is not an attempt: `attempts` stays, nothing bounces, and its 72-hour retry window
starts again when the budget lets it go (`expiry_from`).

A round that gets no connection slot gives its recipients back untouched and spends nothing.

Sites are steered between the nodes that deliver: a node claiming for a destination new to
it (none of its rounds holds a slot there) while it already sends to more destinations than
another live delivering node does yields it for a moment (`yielded`), so the less busy node's
queue takes it and two sites go through two nodes' event loops rather than share one (a
node's loop is what bounds its rate: issue 32). A queue that yielded once takes the
destination at its next claim if still nobody has (`steer` off): the other node may be busy,
stalled or gone. A site a node already sends to stays with it while it has work there.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from engine.delivery import egress_sources, policies
from engine.delivery.policies import Effective, Limit
from engine.platform import dns as lookups
from engine.platform.runtime import Runtime
from engine.platform.settings import Caps
from engine.sending import statuses
from engine.sending.statuses import Trigger
from engine.webhooks import outbox
from storage import delivery_policies as stored
from storage import destination_slots, emails, nodes
from storage.codec import from_json, new_id
from storage.egress import Source
from storage.emails import Event, Recipient
from storage.tx import Tx

THROTTLED = "throttled"  # the reason a deferred recipient's events and response carry


@dataclass(frozen=True, slots=True)
class Destination:
    """A recipient domain and its MX hosts (the domain itself when it has none)."""

    domain: str
    mx_hosts: tuple[str, ...]


async def destination(rt: Runtime, domain: str) -> Destination | None:
    """The domain's MX hosts for matching rules; None when DNS cannot answer now (the
    round then goes by recipient-domain rules alone, and the next one asks again)."""
    try:
        records = await lookups.mx(rt.resolver, domain)
    except lookups.TemporaryDnsError:
        return None
    return Destination(domain, tuple(host for _, host in records) or (domain,))


@dataclass(frozen=True, slots=True)
class Claimed:
    """A shaped claim: the recipients to send now, the slots taken for them (under `key`),
    the connections and messages per connection allowed, and when the next recipient
    (a throttled one included) falls due; `slots_busy` when no connection was free."""

    recipients: list[Recipient]
    slots: list[int]
    next_due: datetime | None
    slots_busy: bool
    key: str
    connections: int
    per_connection: int | None
    # The egress source of each email sent from one (engine/delivery/egress_sources.py);
    # an email not in it leaves by the default egress.
    sources: dict[str, Source] = field(default_factory=dict)
    yielded: bool = False  # left for a less busy node to take (claimed nothing)


def _effective(
    tx: Tx,
    claimed: Sequence[Recipient],
    dest: Destination,
    key: str,
    caps: Caps,
    now: datetime,
) -> tuple[dict[str, stored.Sending], dict[str, Effective], dict[str, Source]]:
    """What applies to each claimed email (by id), and the egress source of each."""
    sending = stored.sending_of(tx, [r.email_id for r in claimed])
    sources = egress_sources.sources_for(tx, sending)
    workspaces = {s.workspace_id for s in sending.values()}
    rules, ramps = stored.rules_of(tx, workspaces), stored.ramps_of(tx, workspaces)
    per_pair: dict[tuple[str, str, str | None], Effective] = {}
    found_for: dict[str, Effective] = {}
    for email_id, s in sending.items():
        source = sources.get(email_id)
        pair = (s.workspace_id, s.domain_id, None if source is None else source.id)
        if pair not in per_pair:
            applicable = policies.ordered(
                rules[s.workspace_id], s.domain_id, dest.domain, dest.mx_hosts
            )
            found = policies.effective(applicable, caps, key)
            ramp = ramps.get((s.workspace_id, s.domain_id))
            limit = (
                None
                if ramp is None
                else policies.ramp_limit(egress_sources.ramp_of(ramp, source), now.date(), key)
            )
            if limit is not None:
                # replace, not a new Effective: the rule connections came from stays known
                found = replace(found, limits=(*found.limits, limit))
            per_pair[pair] = egress_sources.per_source(found, source)
        found_for[email_id] = per_pair[pair]
    return sending, found_for, sources


def claim(
    tx: Tx,
    dest: Destination,
    key: str | None,
    limit: int,
    held: int,
    node: str,
    now: datetime,
    until: datetime,
    batch: int,
    caps: Caps,
    steer: bool,
) -> Claimed:
    """Claim a round for `dest`. `key`: the slot key the queue already uses (None on its
    first round: decided here); `limit`: the connection limit of its round before; `held`:
    the slots it holds from the round before; `steer`: yield the destination to a less busy
    node if it is new to this one."""
    if key is None:
        key = policies.destination_key(dest.domain, dest.mx_hosts, stored.suffix_patterns(tx))
    elif not held and stored.slots_taken(tx, key, limit, now) >= limit:
        # Every slot of the limit the last round had is taken elsewhere: claim nothing.
        return Claimed([], [], None, True, key, limit, None)
    if nodes.declared_dead(tx, node):
        # Its leases were freed: nothing is claimed until its heartbeat has taken it back
        # (engine/platform/tenure.py); the queue looks again as it does when every slot is taken.
        return Claimed([], [], None, True, key, limit, None)
    if steer and not held and _busier_than_another(tx, key, node, now):
        return Claimed([], [], None, True, key, limit, None, yielded=True)
    claimed, next_due = emails.claim(tx, dest.domain, now, until, node, batch)
    if not claimed:
        return Claimed([], [], next_due, False, key, limit, None)
    sending, effective, sources = _effective(tx, claimed, dest, key, caps, now)
    default = policies.effective([], caps, key)
    applying = [effective.get(r.email_id, default) for r in claimed]
    # The round may open as many connections as the most any of its mail may use; mail
    # under a lower limit takes only its share of them (`_own_shares`).
    connections = max(e.connections for e in applying)
    claimed, applying, returned = _own_shares(tx, dest, claimed, applying, sending, now)
    if returned:
        stored.unlease(tx, [(r.email_id, r.address) for r in returned])
        # They are due: the queue comes back for them once a connection of theirs is free.
        next_due = now if claimed else next_due
    if not claimed:  # every recipient waits for a connection its own limit leaves free
        return Claimed([], [], next_due, True, key, connections, None)
    per_connection = min((e.per_connection for e in applying if e.per_connection), default=None)
    slots: list[int] = []
    if held < connections:
        slots = destination_slots.acquire(
            tx, key, connections, connections - held, node, now, until
        )
    if not slots and not held:
        stored.unlease(tx, [(r.email_id, r.address) for r in claimed])
        return Claimed([], [], next_due, True, key, connections, per_connection)
    kept, waits = _spend(tx, claimed, applying, now)
    if waits:
        _record_waits(tx, waits, sending, now)
        earliest = min(when for _, when, _ in waits)
        next_due = earliest if next_due is None else min(next_due, earliest)
    # One connection per email at most: give back the slots the round cannot use (no other
    # node saw them taken, so nobody needs waking).
    keep = max(0, len({r.email_id for r in kept}) - held)
    destination_slots.release(tx, key, slots[keep:], node, announce=False)
    mine = {r.email_id for r in kept}
    chosen = {email_id: src for email_id, src in sources.items() if email_id in mine}
    return Claimed(kept, slots[:keep], next_due, False, key, connections, per_connection, chosen)


def _busier_than_another(tx: Tx, key: str, node: str, now: datetime) -> bool:
    """Whether the destination is new to `node` (it holds none of its slots, for no round) and
    another live delivering node sends to fewer other destinations than `node` does now."""
    mine, others = destination_slots.sites_held(tx, node, key, now)
    return mine is not None and any(theirs < mine for theirs in others)


def _share_of(
    found: Effective, sending: stored.Sending | None, most: int
) -> tuple[object, stored.Rule | None] | None:
    """The share of the round's connections mail under `found` belongs to, when its limit is
    below the round's `most`, and the workspace's own rule that sets it (None: a built-in or
    default limit, held within the round). Mail at the round's limit needs no share: the
    round opens no more connections than that, and its slots hold it across nodes."""
    if sending is None or found.connections >= most:
        return None
    rule = found.connections_rule
    if rule is not None and not rule.builtin:
        return rule.id, rule
    return (sending.workspace_id, sending.domain_id), None


def _held_elsewhere(
    tx: Tx, dest: Destination, rule: stored.Rule, sending: stored.Sending, now: datetime
) -> set[str]:
    """The emails under a workspace's own rule that rounds on any node hold at this domain,
    read under a lock on the rule, so two claims at once queue rather than both take one."""
    stored.lock_budgets(tx, {f"connections:{rule.id}": policies.window_start("day", now)})
    return stored.emails_in_flight(tx, dest.domain, sending.workspace_id, rule.domain_id, now)


def _own_shares(
    tx: Tx,
    dest: Destination,
    claimed: Sequence[Recipient],
    applying: Sequence[Effective],
    sending: dict[str, stored.Sending],
    now: datetime,
) -> tuple[list[Recipient], list[Effective], list[Recipient]]:
    """A workspace's policies apply to its own mail only: mail under a lower connection
    limit than the round's keeps, in claim order, as many emails (each on one connection
    at a time) as its limit leaves free; the rest is given back. Operator caps are already
    in every limit. The recipients kept, what applies to each, and those given back."""
    most = max(e.connections for e in applying)
    ours = {r.email_id for r in claimed}  # leased by this claim: not held elsewhere
    shares: dict[object, set[str]] = {}  # the emails each share holds, here and elsewhere
    kept: list[Recipient] = []
    kept_effective: list[Effective] = []
    returned: list[Recipient] = []
    for recipient, found in zip(claimed, applying, strict=True):
        s = sending.get(recipient.email_id)
        share = _share_of(found, s, most)
        if share is not None and s is not None:
            share_key, rule = share
            if share_key not in shares:
                shares[share_key] = (
                    set() if rule is None else _held_elsewhere(tx, dest, rule, s, now) - ours
                )
            emails = shares[share_key]
            if recipient.email_id not in emails and len(emails) >= found.connections:
                returned.append(recipient)
                continue
            emails.add(recipient.email_id)
        kept.append(recipient)
        kept_effective.append(found)
    return kept, kept_effective, returned


def _spend(
    tx: Tx, claimed: Sequence[Recipient], applying: Sequence[Effective], now: datetime
) -> tuple[list[Recipient], list[tuple[Recipient, datetime, Limit]]]:
    """Spend budgets on the recipients in claim order; those that do not fit wait: until
    the window where the count has room, or, for a paced rate, until their turn at its pace
    (engine/delivery/policies.py, GCRA)."""
    every = {limit.budget_key: limit for e in applying for limit in e.limits}
    if not every:
        return list(claimed), []
    starts = {unit: policies.window_start(unit, now) for unit in policies.UNITS}
    rows = stored.lock_budgets(tx, {k: starts[lim.unit] for k, lim in every.items()})
    used: dict[str, int] = {}
    tats: dict[str, datetime | None] = {}
    for budget_key, limit in every.items():
        row = rows.get(budget_key, stored.Budget(starts[limit.unit], 0))
        used[budget_key] = row.used if row.window_start == starts[limit.unit] else 0
        tats[budget_key] = row.tat
    before = (dict(used), dict(tats))
    over: dict[str, int] = defaultdict(int)  # recipients already waiting on each budget
    kept: list[Recipient] = []
    waits: list[tuple[Recipient, datetime, Limit]] = []
    for recipient, found in zip(claimed, applying, strict=True):
        returns = []
        for lim in found.limits:
            key = lim.budget_key
            if used[key] >= lim.amount:
                # The window in which the count has room, one further per budget-full
                # already waiting from this round: a long backlog is spread, not retried
                # at once.
                ahead = lim.windows_until_room(over[key])
                returns.append((starts[lim.unit] + policies.UNITS[lim.unit] * ahead, lim))
            elif lim.paced and (turn := lim.earliest(tats[key], now)) > now:
                # Its turn at the pace, one interval further per recipient already waiting.
                returns.append((turn + lim.interval * over[key], lim))
        if not returns:
            for lim in found.limits:
                used[lim.budget_key] += 1
                if lim.paced:
                    tats[lim.budget_key] = lim.after_one(tats[lim.budget_key], now)
            kept.append(recipient)
            continue
        when, why = max(returns, key=lambda pair: pair[0])
        for _, lim in returns:
            over[lim.budget_key] += 1
        waits.append((recipient, when, why))
    changed = {
        k: stored.Budget(starts[every[k].unit], n, tats[k])
        for k, n in used.items()
        if n != before[0][k] or tats[k] != before[1][k]
    }
    stored.save_budgets(tx, changed)
    stored.prune_budgets(tx, starts["day"] - policies.UNITS["day"])
    return kept, waits


def _record_waits(
    tx: Tx,
    waits: Sequence[tuple[Recipient, datetime, Limit]],
    sending: dict[str, stored.Sending],
    now: datetime,
) -> None:
    """Throttled recipients: `deferred` until their budget returns, with an event the first
    time (a recipient already waiting for budget is not announced again)."""
    rows = []
    events: list[Event] = []
    for recipient, when, limit in waits:
        status = statuses.recipient_next(recipient.status, Trigger.THROTTLED)
        response = f"{THROTTLED}: {limit.why}"
        rows.append((recipient.email_id, recipient.address, status, when, response))
        s = sending.get(recipient.email_id)
        if s is None or (recipient.last_response or "").startswith(THROTTLED):
            continue
        meta = {
            "subject": s.subject,
            "tags": from_json(s.tags),
            "reason": THROTTLED,
            "limit": limit.why,
            "next_attempt_at": when.isoformat(),
        }
        at = now + timedelta(microseconds=len(events))
        events.append(
            Event(
                new_id(),
                recipient.email_id,
                s.workspace_id,
                "deferred",
                recipient.address,
                meta,
                at,
            )
        )
    stored.throttle(tx, rows, now)
    outbox.record(tx, events)
    emails.summarise(tx, [r.email_id for r, _, _ in waits], now, statuses.SUMMARISE)
