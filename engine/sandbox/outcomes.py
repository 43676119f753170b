"""The sandbox's later outcomes: a complaint an hour on, an open and a click a minute or two on;
listed while pending, and brought forward on request.

Stored with the capture as work rows (storage/sandbox.py) and claimed through the shared
leased-work loop (engine/platform/leased_worker.py), so they survive a restart and run on one node.
Each goes through the engine's own path, with its events and signed webhooks: a complaint
through the feedback-loop recording (engine/forwarding/feedback.py: `complained`, and a
`complaint` suppression) in the same unit that marks it done, so it happens once; an open or
a click through the tracking links (engine/sending/tracking.py), signed as the ones in the
message, then marked done (at least once, as a reader may open twice).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime, timedelta

import trio

from engine.forwarding import feedback
from engine.mail.reports import Report
from engine.platform import faults
from engine.platform.leased_worker import LeasedWorker
from engine.platform.nodes import LEASE
from engine.platform.runtime import Principal, Runtime
from engine.platform.settings import ComplaintLimits
from engine.sandbox.scripts import CLICK, COMPLAINT, OPEN
from engine.sending import tracking
from storage import emails, sandbox
from storage.leases import Claimed
from storage.sandbox import Scheduled
from storage.tx import Tx

POLL = timedelta(seconds=15)  # outcomes fall due a minute or more after they are stored
IN_FLIGHT = 50
BATCH = 100
# The scripted reader, a minute or more after delivery: counted as a human.
READER = tracking.Hit("GET", "Postroom-Sandbox/1")
_FIRST_LINK = re.compile(r"""<a\b[^>]*?\bhref\s*=\s*["'](https?://[^"'\s]+)["']""", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class OutcomeStatistics:
    in_flight: int
    done: int


async def pending(rt: Runtime, who: Principal, email_id: str | None) -> list[Scheduled]:
    """The workspace's scripted outcomes still to come (of one email, given one), soonest
    first."""
    return await rt.db.read(sandbox.pending_outcomes, who.workspace_id, email_id)


async def fast_forward(rt: Runtime, who: Principal, email_id: str | None) -> int:
    """Make the workspace's pending outcomes (of one email, given one) due now, so a
    complaint scripted for an hour on can be seen at once; they happen at the worker's next
    pass (within POLL). How many were brought forward."""
    brought: int = await rt.db.write(
        sandbox.bring_forward, who.workspace_id, email_id, rt.clock.now()
    )
    return brought


def _complain(tx: Tx, item: Scheduled, now: datetime, limits: ComplaintLimits) -> None:
    email = emails.by_ids(tx, [item.email_id]).get(item.email_id)
    if email is not None:
        report = Report("complaint", feedback_type="abuse", complainants=(item.recipient,))
        feedback.record(tx, email, report, now, limits)
    sandbox.finish(tx, item.id, now)


def _email_html(tx: Tx, email_id: str) -> str | None:
    email = emails.by_ids(tx, [email_id]).get(email_id)
    return None if email is None else email.html


def token_of(url: str) -> str:
    """The signed token at the end of a tracking URL."""
    return url.rpartition("/")[2]


class SandboxOutcomes:
    name = "sandbox"
    table = sandbox.OUTCOMES

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt
        self._worker = LeasedWorker(rt, self, in_flight=IN_FLIGHT, batch=BATCH, poll=POLL)
        self._done = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        await self._worker.run(task_status)

    def key(self, item: Scheduled) -> str:
        return item.id

    async def claim(self, now: datetime, limit: int) -> Claimed[Scheduled]:
        rt = self._rt
        return await rt.db.write(
            sandbox.claim_due, now, now + LEASE, rt.node, limit, faults.policy(now)
        )

    async def work(self, item: Scheduled) -> None:
        rt = self._rt
        links = tracking.Links(rt.public_url, rt.secret_key, item.email_id, item.recipient)
        if item.kind == COMPLAINT:
            await rt.db.write(_complain, item, rt.clock.now(), rt.complaint_limits)
        elif item.kind == OPEN:
            await tracking.opened(rt, token_of(links.open), READER)
            await rt.db.write(sandbox.finish, item.id, rt.clock.now())
        elif item.kind == CLICK:
            html = await rt.db.read(_email_html, item.email_id)
            found = _FIRST_LINK.search(html or "")
            url = found.group(1) if found else rt.public_url + "/"
            await tracking.clicked(rt, token_of(links.click(url)), READER)
            await rt.db.write(sandbox.finish, item.id, rt.clock.now())
        else:
            raise ValueError(f"unknown sandbox outcome {item.kind!r}")
        self._done += 1

    def statistics(self) -> OutcomeStatistics:
        return OutcomeStatistics(self._worker.in_flight, self._done)
