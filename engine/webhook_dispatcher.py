"""The webhook dispatcher: POSTs signed deliveries and retries failures on the spec's schedule.

Deliveries are claimed from the database with a lease (they survive restarts) and each is
POSTed by a task of its own, through one pooled HTTP/1.1 client per endpoint origin, at most
`PER_ENDPOINT` at a time per origin, so one slow receiver cannot hold back the others. The body
is sent exactly as stored, with `X-Webhook-Signature`: the hex HMAC-SHA256 of that body keyed
with the webhook's secret. A 2xx is `delivered`; anything else, or no answer within 10 s, is a
failure, retried after 1 m, 5 m, 30 m, 2 h, 6 h, 24 h and 48 h; the 8th failure makes the
delivery `dead` (replayable). Each outcome is one unit of work through group commit.

New deliveries are picked up within `POLL` (they are written by whichever code records the
event, in its own transaction).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
from collections import defaultdict
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import trio

from engine import outbound_http
from engine.runtime import Runtime
from storage import webhooks
from storage.webhooks import Attempt, Delivery

RETRY_DELAYS = (
    timedelta(minutes=1),
    timedelta(minutes=5),
    timedelta(minutes=30),
    timedelta(hours=2),
    timedelta(hours=6),
    timedelta(hours=24),
    timedelta(hours=48),
)
# The 8th failure makes a delivery dead, so the spec's last step (72 h, which would follow the
# 8th failure) is never waited: see docs/decisions.md.
MAX_ATTEMPTS = 8
TIMEOUT = 10.0
PER_ENDPOINT = 16  # concurrent POSTs to one origin
MAX_IN_FLIGHT = 1000
BATCH = 500
LEASE = timedelta(minutes=2)
POLL = timedelta(milliseconds=250)
RESPONSE_KEEP = 2048  # bytes of a receiver's answer kept in the log

log = logging.getLogger("postroom.webhooks")


def signature(secret: str, body: bytes) -> str:
    """The `X-Webhook-Signature` of a body."""
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def next_retry(failures: int) -> timedelta | None:
    """How long to wait after the `failures`-th failure; None once the delivery is dead."""
    return None if failures >= MAX_ATTEMPTS else RETRY_DELAYS[failures - 1]


@dataclass(frozen=True, slots=True)
class DispatcherStatistics:
    in_flight: int
    delivered: int
    failed_attempts: int
    dead: int


class WebhookDispatcher:
    name = "webhooks"

    def __init__(self, rt: Runtime, extra_ca_file: Path | None) -> None:
        self._rt = rt
        self._tls = outbound_http.tls_context(extra_ca_file)
        self._clients: dict[str, httpx.AsyncClient] = {}
        self._endpoint_limits: dict[str, trio.CapacityLimiter] = defaultdict(
            lambda: trio.CapacityLimiter(PER_ENDPOINT)
        )
        self._in_flight = trio.CapacityLimiter(MAX_IN_FLIGHT)
        self._counts: dict[str, int] = defaultdict(int)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        rt = self._rt
        await rt.db.write(webhooks.release_leases, rt.node)
        try:
            async with trio.open_nursery() as nursery:
                task_status.started()
                while True:
                    now = rt.clock.now()
                    room = min(BATCH, int(self._in_flight.available_tokens))
                    claimed, next_due = (
                        await rt.db.write(webhooks.claim_due, now, now + LEASE, rt.node, room)
                        if room
                        else ([], None)
                    )
                    for delivery, secret in claimed:
                        await self._in_flight.acquire_on_behalf_of(delivery.id)
                        nursery.start_soon(self._deliver, delivery, secret)
                    if claimed:
                        continue
                    wake = now + POLL if next_due is None else min(next_due, now + POLL)
                    await rt.clock.sleep_until(wake)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(5):
                for client in self._clients.values():
                    await client.aclose()

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

    async def _deliver(self, delivery: Delivery, secret: str) -> None:
        try:
            parts = urlsplit(delivery.endpoint_url)
            origin = f"{parts.scheme}://{parts.netloc}"
            async with self._endpoint_limits[origin]:
                attempt = await self._post(delivery, secret, origin)
            await self._rt.db.write(webhooks.record_attempts, [attempt], self._rt.clock.now())
        finally:
            self._in_flight.release_on_behalf_of(delivery.id)

    async def _post(self, delivery: Delivery, secret: str, origin: str) -> Attempt:
        body = delivery.payload.encode()
        headers = {
            "Content-Type": "application/json",
            "X-Webhook-Signature": signature(secret, body),
            "User-Agent": "Postroom-Webhooks/1",
        }
        status: int | None = None
        answer: str
        try:
            with trio.fail_after(TIMEOUT):
                response = await self._client(origin).post(
                    delivery.endpoint_url, content=body, headers=headers
                )
            status = response.status_code
            answer = response.text[:RESPONSE_KEEP]
        except (trio.TooSlowError, httpx.TimeoutException):
            answer = f"no answer within {TIMEOUT:.0f} s"
        except httpx.HTTPError as exc:
            answer = f"{type(exc).__name__}: {exc}"[:RESPONSE_KEEP]
        if status is not None and 200 <= status < 300:
            self._counts["delivered"] += 1
            return Attempt(delivery.id, "delivered", None, status, answer)
        self._counts["failed_attempts"] += 1
        delay = next_retry(delivery.attempt + 1)
        if delay is None:
            self._counts["dead"] += 1
            return Attempt(delivery.id, "dead", None, status, answer)
        return Attempt(delivery.id, "retrying", self._rt.clock.now() + delay, status, answer)

    def statistics(self) -> DispatcherStatistics:
        return DispatcherStatistics(
            in_flight=MAX_IN_FLIGHT - int(self._in_flight.available_tokens),
            delivered=self._counts["delivered"],
            failed_attempts=self._counts["failed_attempts"],
            dead=self._counts["dead"],
        )
