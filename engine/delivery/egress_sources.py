"""Which egress source an email leaves from, and how limits count per source (issue 32).

A source is a bind address and an EHLO name (storage/egress.py). The pool that applies to
an email is its sending domain's, else its workspace's, else none: the default egress, from
the host's own address with the configured SMTP host name (`Source` None). Within a pool a
source is chosen by weight from a stable hash of the email's id, so every attempt of one
email leaves from the same source and a pool's mail spreads by the weights.

Destination policies and warm-up ramps count per source: a source's mail spends budgets of
its own (`<key>@<source id>`), and a ramp counts its days for a source from no earlier than
the day the source was made, so a new source warms up on its own. Operator caps bound all
the mail, whatever the source.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import replace

from engine.delivery.policies import Effective, Limit
from storage import egress
from storage.delivery_policies import Ramp, Sending
from storage.egress import Member, Pool, Source
from storage.tx import Tx


def pool_for(
    workspace_id: str, domain_id: str, assignments: Mapping[tuple[str, str], str]
) -> str | None:
    """The pool applying to mail from one sending domain: the domain's, else the workspace's."""
    return assignments.get((egress.DOMAIN, domain_id)) or assignments.get(
        (egress.WORKSPACE, workspace_id)
    )


def _members(pool: Pool, sources: Mapping[str, Source]) -> list[Member]:
    """The pool's members mail can leave from: weighted, and their source still there."""
    return [m for m in pool.sources if m.source_id in sources and m.weight > 0]


def shares(pool: Pool, sources: Mapping[str, Source]) -> list[tuple[Source, float]]:
    """Each source of the pool with the share of its mail it takes (by weight)."""
    members = _members(pool, sources)
    total = sum(m.weight for m in members)
    return [(sources[m.source_id], m.weight / total) for m in members]


def choose(pool: Pool, sources: Mapping[str, Source], email_id: str) -> Source | None:
    """The pool's source for one email, by weight (None: a pool with no source left)."""
    members = _members(pool, sources)
    total = sum(m.weight for m in members)
    if not total:
        return None
    point = int.from_bytes(hashlib.sha256(email_id.encode()).digest()[:8], "big") % total
    for member in members:
        if point < member.weight:
            return sources[member.source_id]
        point -= member.weight
    raise AssertionError("a point below the total weight falls on a member")


def sources_for(tx: Tx, sending: Mapping[str, Sending]) -> dict[str, Source]:
    """The source of each email (by id) whose workspace or domain has a pool; the others
    leave by the default egress."""
    assignments = egress.assignments_of(
        tx, (s.workspace_id for s in sending.values()), (s.domain_id for s in sending.values())
    )
    if not assignments:
        return {}
    pools = egress.pools_of(tx, assignments.values())
    sources = egress.sources_of(tx, (m.source_id for p in pools.values() for m in p.sources))
    chosen: dict[str, Source] = {}
    for email_id, s in sending.items():
        pool = pools.get(pool_for(s.workspace_id, s.domain_id, assignments) or "")
        source = None if pool is None else choose(pool, sources, email_id)
        if source is not None:
            chosen[email_id] = source
    return chosen


def ramp_of(ramp: Ramp, source: Source | None) -> Ramp:
    """The ramp as it applies to mail from `source`: a source made after the ramp started
    starts on the ramp's first day."""
    if source is None or source.created_at.date() <= ramp.starts_on:
        return ramp
    return replace(ramp, starts_on=source.created_at.date())


def counted_for(limit: Limit, source: Source | None) -> Limit:
    """The limit as mail from `source` spends it: under the source's own budget
    (`<key>@<source id>`), but an operator cap (`cap:`) shared by every source."""
    if source is None or limit.key.startswith("cap:"):
        return limit
    return replace(limit, key=f"{limit.key}@{source.id}")


def per_source(found: Effective, source: Source | None) -> Effective:
    """The limits of `found` counted under the source's own budgets (`counted_for`)."""
    if source is None:
        return found
    return replace(found, limits=tuple(counted_for(lim, source) for lim in found.limits))
