"""The webhook dispatcher: POSTs signed deliveries and retries failures on the spec's schedule.

Deliveries are claimed from the database with a lease (they survive restarts) through the
shared leased-work loop (engine/platform/leased_worker.py), and each is POSTed by a task of its own,
through one pooled keep-alive HTTP/1.1 client (engine/platform/http1_client.py) holding at most
`PER_ENDPOINT` connections per endpoint origin, so one slow receiver cannot hold back the
others. The body is sent exactly as stored, with `X-Webhook-Signature`: the hex HMAC-SHA256
of that body keyed with the webhook's secret, and the webhook's basic-auth credentials only
to the origin of the URL they were given with.
A sandboxed workspace's deliveries are captured instead (engine/sandbox/posts.py, given by
postroom/service.py as a `PostCapture`), never sent. A 2xx is `delivered`; anything else — no answer within 10 s, a refused connection, a URL that
cannot be sent to — is a failed attempt, retried on the schedule of engine/platform/outbound_http.py;
the 8th failure makes the delivery `dead` (replayable). Each outcome is one unit of work
through group commit.

New deliveries wake it on every node (the unit that records an event and its deliveries
announces `webhooks`, engine/platform/wakeups.py); it also looks every `POLL`, a safety net.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Protocol

import trio

from engine.platform import faults, outbound_http
from engine.platform.leased_worker import LeasedWorker
from engine.platform.nodes import LEASE
from engine.platform.runtime import Runtime
from engine.webhooks import profiles
from storage import webhooks
from storage.leases import Claimed
from storage.tx import Tx
from storage.webhooks import Attempt, Delivery

TIMEOUT = 10.0
PER_ENDPOINT = 16  # concurrent POSTs to one origin
MAX_IN_FLIGHT = 1000
BATCH = 500
POLL = timedelta(seconds=5)

log = logging.getLogger("postroom.webhooks")

Work = tuple[Delivery, str]  # a delivery and its webhook's secret


def signature(secret: str, body: bytes) -> str:
    """The `X-Webhook-Signature` of a body."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


class PostCapture(Protocol):
    """Where the POSTs of sandboxed workspaces go instead of the network."""

    @property
    def answer(self) -> str:
        """The response a captured POST is recorded with."""
        ...

    async def capture(
        self,
        workspace_id: str,
        kind: str,
        source_id: str,
        request: tuple[str, Mapping[str, str], bytes],
        outcome: Callable[[Tx, datetime], None],
    ) -> None:
        """Store the POST `request` (URL, header fields, body) and, in the same unit of
        work, `outcome` (called with the unit and the time of the capture)."""
        ...


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    in_flight: int
    delivered: int
    failed_attempts: int
    dead: int


class WebhookDispatcher:
    name = "webhooks"
    table = webhooks.DELIVERIES

    def __init__(self, rt: Runtime, extra_ca_file: Path | None, sandbox: PostCapture) -> None:
        self._rt = rt
        self._sandbox = sandbox
        tls = outbound_http.tls_context(extra_ca_file)
        self._client = outbound_http.client(rt, tls, PER_ENDPOINT)
        self._worker = LeasedWorker(
            rt, self, in_flight=MAX_IN_FLIGHT, batch=BATCH, poll=POLL, wakeups=rt.wakeups.webhooks
        )
        self._counts: dict[str, int] = defaultdict(int)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._worker.run(task_status)
        finally:
            await self._client.aclose()  # a restart by the supervisor opens new connections

    async def drain(self) -> None:
        """Stop claiming; return once the POSTs under way are answered and recorded."""
        await self._worker.drain()

    def key(self, item: Work) -> str:
        return item[0].id

    async def claim(self, now: datetime, limit: int) -> Claimed[Work]:
        rt = self._rt
        return await rt.db.write(
            webhooks.claim_due, now, now + LEASE, rt.node, limit, faults.policy(now)
        )

    async def work(self, item: Work) -> None:
        delivery, secret = item
        body = profiles.body(delivery.send_format, delivery.payload)
        headers = {
            "Content-Type": "application/json",
            "X-Webhook-Signature": signature(secret, body),
            "User-Agent": "Postroom-Webhooks/1",
        }
        if delivery.send_basic_auth is not None and self._same_origin(delivery):
            headers["Authorization"] = delivery.send_basic_auth.header()
        if delivery.sandboxed:
            await self._capture(delivery, headers, body)
            return
        answer = await outbound_http.post(
            self._client, delivery.endpoint_url, body, headers, TIMEOUT
        )
        attempt = self._outcome(delivery, answer)
        rt = self._rt
        await rt.db.write(webhooks.record_attempts, [attempt], rt.clock.now(), rt.node)

    async def _capture(self, delivery: Delivery, headers: dict[str, str], body: bytes) -> None:
        """The POST of a sandboxed workspace: captured as sent, and delivered."""
        attempt = Attempt(delivery.id, "delivered", None, None, self._sandbox.answer)

        def delivered(tx: Tx, now: datetime) -> None:
            webhooks.record_attempts(tx, [attempt], now, self._rt.node)

        request = (delivery.endpoint_url, headers, body)
        await self._sandbox.capture(
            delivery.workspace_id, "webhook", delivery.id, request, delivered
        )

    @staticmethod
    def _same_origin(delivery: Delivery) -> bool:
        """Whether the delivery goes to the origin its webhook's credentials were given for
        (one queued, or replayed, for a URL the webhook has since left does not)."""
        there = outbound_http.origin(delivery.endpoint_url)
        return there is not None and there == outbound_http.origin(delivery.webhook_url)

    def _outcome(self, delivery: Delivery, answer: outbound_http.Answer) -> Attempt:
        if answer.ok:
            self._counts["delivered"] += 1
            return Attempt(delivery.id, "delivered", None, answer.status, answer.text)
        self._counts["failed_attempts"] += 1
        delay = outbound_http.next_retry(delivery.attempt + 1)
        if delay is None:
            self._counts["dead"] += 1
            return Attempt(delivery.id, "dead", None, answer.status, answer.text)
        next_at = self._rt.clock.now() + delay
        return Attempt(delivery.id, "retrying", next_at, answer.status, answer.text)

    def statistics(self) -> DispatcherStatistics:
        return DispatcherStatistics(
            in_flight=self._worker.in_flight,
            delivered=self._counts["delivered"],
            failed_attempts=self._counts["failed_attempts"],
            dead=self._counts["dead"],
        )
