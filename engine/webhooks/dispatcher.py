"""The webhook dispatcher: POSTs signed deliveries and retries failures on the spec's schedule.

Deliveries are claimed from the database with a lease (they survive restarts) through the
shared leased-work loop (engine/leased_worker.py), and each is POSTed by a task of its own,
through one pooled HTTP/1.1 client per endpoint origin, at most `PER_ENDPOINT` at a time per
origin, so one slow receiver cannot hold back the others. The body is sent exactly as stored,
with `X-Webhook-Signature`: the hex HMAC-SHA256 of that body keyed with the webhook's secret.
A 2xx is `delivered`; anything else — no answer within 10 s, a refused connection, a URL that
cannot be sent to — is a failed attempt, retried on the schedule of engine/outbound_http.py;
the 8th failure makes the delivery `dead` (replayable). Each outcome is one unit of work
through group commit.

New deliveries wake it on every node (the unit that records an event and its deliveries
announces `webhooks`, engine/wakeups.py); it also looks every `POLL`, a safety net.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import trio

from engine import faults, outbound_http
from engine.leased_worker import LeasedWorker
from engine.nodes import LEASE
from engine.runtime import Runtime
from engine.webhooks import profiles
from storage import webhooks
from storage.leases import Claimed
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


def _origin(url: str) -> str:
    try:
        parts = urlsplit(url)
        return f"{parts.scheme}://{parts.netloc}"
    except ValueError:  # a URL stored by an older release; the POST will say what is wrong
        return url


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    in_flight: int
    delivered: int
    failed_attempts: int
    dead: int


class WebhookDispatcher:
    name = "webhooks"
    table = webhooks.DELIVERIES

    def __init__(self, rt: Runtime, extra_ca_file: Path | None) -> None:
        self._rt = rt
        self._tls = outbound_http.tls_context(extra_ca_file)
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._endpoint_limits: dict[str, trio.CapacityLimiter] = defaultdict(
            lambda: trio.CapacityLimiter(PER_ENDPOINT)
        )
        self._worker = LeasedWorker(
            rt, self, in_flight=MAX_IN_FLIGHT, batch=BATCH, poll=POLL, wakeups=rt.wakeups.webhooks
        )
        self._counts: dict[str, int] = defaultdict(int)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        try:
            await self._worker.run(task_status)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                for client in self._clients.values():
                    await client.aclose()
            self._clients.clear()  # a restart by the supervisor opens fresh ones

    def key(self, item: Work) -> str:
        return item[0].id

    async def claim(self, now: datetime, limit: int) -> Claimed[Work]:
        rt = self._rt
        return await rt.db.write(
            webhooks.claim_due, now, now + LEASE, rt.node, limit, faults.policy(now)
        )

    def _client(self, origin: str) -> httpx.AsyncClient:
        client = self._clients.get(origin)
        if client is None:
            client = outbound_http.client(
                self._rt,
                self._tls,
                TIMEOUT,
                httpx.Limits(max_connections=PER_ENDPOINT, max_keepalive_connections=PER_ENDPOINT),
            )
            self._clients[origin] = client
        return client

    async def work(self, item: Work) -> None:
        delivery, secret = item
        body = profiles.body(delivery.send_format, delivery.payload)
        headers = {
            "Content-Type": "application/json",
            "X-Webhook-Signature": signature(secret, body),
            "User-Agent": "Postroom-Webhooks/1",
        }
        origin = _origin(delivery.endpoint_url)
        async with self._endpoint_limits[origin]:
            answer = await outbound_http.post(
                self._client(origin), delivery.endpoint_url, body, headers, TIMEOUT
            )
        attempt = self._outcome(delivery, answer)
        await self._rt.db.write(webhooks.record_attempts, [attempt], self._rt.clock.now())

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
