"""The domain checker actor: re-checks pending domains until their records appear.

An owner publishes the DNS records and the domain becomes verified by itself, as with the
hosted services, without having to call verify again. Pending domains younger than
`GIVE_UP_AFTER` are checked every `INTERVAL`, by one node at a time (the leadership
`domain_checker`, engine/platform/nodes.py); all state is in the database, so a restart simply
resumes. Automatic checks log only a change of status, under the actor `postroom`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import timedelta

import trio

from engine.domains import bounce_domain
from engine.domains import registry as domain_rules
from engine.platform import faults, nodes
from engine.platform.errors import EngineError
from engine.platform.runtime import Runtime
from storage import domains

INTERVAL = timedelta(minutes=5)
GIVE_UP_AFTER = timedelta(hours=72)
SYSTEM_ACTOR = "postroom"

log = logging.getLogger("postroom.domains")


@dataclass(frozen=True, slots=True)
class DomainCheckerStatistics:
    rounds: int
    checks: int
    verified: int


class DomainChecker:
    name = "domain_checker"

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._rounds = 0
        self._checks = 0
        self._verified = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._rt.clock.sleep_until(self._rt.clock.now() + INTERVAL)
            if await nodes.lead(self._rt, self.name):
                await self.check_pending()

    async def check_pending(self) -> None:
        """One round: check every pending domain still within its checking period."""
        since = self._rt.clock.now() - GIVE_UP_AFTER
        pending = await self._rt.db.read(domains.pending_since, since)
        # Verified domains whose new bounce domain is still to be found, too.
        pending += await bounce_domain.awaiting_check(self._rt, since)
        self._rounds += 1
        for domain in pending:
            self._checks += 1
            try:
                checked = await domain_rules.check(
                    self._rt, SYSTEM_ACTOR, domain, log_every_check=False
                )
            except EngineError as exc:  # e.g. deleted meanwhile, or taken by another workspace
                log.info("domain %s not checked: %s", domain.name, exc.detail)
                continue
            except Exception as exc:  # one domain's fault: checked again next round
                if not faults.blames_item(exc):
                    raise
                self._rt.faults.item_fault(self.name, f"domain {domain.name}", exc)
                continue
            if checked.status == domain_rules.VERIFIED and domain.status != domain_rules.VERIFIED:
                self._verified += 1
                log.info("domain %s verified", domain.name)

    def statistics(self) -> DomainCheckerStatistics:
        return DomainCheckerStatistics(self._rounds, self._checks, self._verified)
