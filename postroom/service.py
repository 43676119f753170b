"""Service start-up: opens the root nursery with storage, the engine and the front doors.

The front doors are assembled here and nowhere else: the API's app gets the console and
the ASGI middleware list (`_front_doors`), beside the SMTP listeners.

Order matters for a clean stop: the front doors stop taking requests (idle keep-alive
connections are closed at once) and let those in flight finish while delivery, webhooks and
forwards drain: they claim nothing more and start no SMTP transaction or POST, and those under
way finish and have their outcomes written, for up to `drain_seconds`
(POSTROOM_DRAIN_SECONDS), so that nothing the receiver already has is sent again after the
restart. Then the engine's actors
are cancelled, the node gives back what it still holds, the group-commit writer drains what
was handed to it and the database closes. Everything accepted was committed before it was
acknowledged, so even a kill -9 loses nothing.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.config import Sockets
from hypercorn.trio.run import worker_serve
from hypercorn.utils import wrap_app

import console
from api.app import create_app
from api.send_edge import send_edge
from api.validation import ASGIApp, body_guard
from engine.contacts.bulk_send import fail_interrupted
from engine.contacts.recovery import BroadcastRecovery
from engine.delivery.router import DeliveryRouter, RouterStatistics
from engine.domains.checker import DomainChecker
from engine.forwarding.forwarder import Forwarder
from engine.platform import nodes
from engine.platform.nodes import Role
from engine.platform.runtime import Runtime
from engine.platform.supervisor import Actor, Supervisor
from engine.platform.wakeups import WakeupRelay
from engine.reports.tls_sender import TlsReporter
from engine.retention import RetentionSweeper
from engine.sandbox.capture import SandboxEgress
from engine.sandbox.outcomes import SandboxOutcomes
from engine.sandbox.posts import PostCaptures
from engine.transfers.timer import TransferTimer
from engine.webhooks.dispatcher import WebhookDispatcher
from mcp_door.http import HttpDoor
from postroom.config import Settings
from postroom.logs import log_left_behind
from postroom.metrics import ServiceMetrics
from postroom.startup import open_runtime
from relay.inbound import inbound_listener
from relay.listener import SmtpListener
from relay.submission import submission_listener
from relay.tls import server_context
from storage import backlog
from storage.database import open_database
from storage.errors import is_outage

log = logging.getLogger("postroom")

# The actors a clean stop drains: what they have under way finishes and is recorded.
Draining = DeliveryRouter | WebhookDispatcher | Forwarder


@dataclass(frozen=True, slots=True)
class RunningService:
    """What a started service hands back: where it listens, and how to stop it."""

    api_url: str
    runtime: Runtime
    stop: Callable[[], None]
    supervisor: Supervisor
    submission_address: tuple[str, int] = ("", 0)  # the SMTP relay's bound address
    inbound_address: tuple[str, int] = ("", 0)  # the inbound MX's bound address

    def idle(self) -> bool:
        """Whether nothing is under way: no unit of work waiting for or in the database, no
        work on a worker thread, no leased item (webhook POST, forward, sandbox outcome) being
        worked, no delivery round out. Work due later (a retry, a scheduled email) is not
        under way. (Tests wait on it.)"""
        db = self.runtime.db
        if db.writer_statistics().unanswered or db.reader_statistics().unanswered:
            return False
        if trio.to_thread.current_default_thread_limiter().borrowed_tokens:
            return False
        for snapshot in self.supervisor.statistics().values():
            if getattr(snapshot, "in_flight", 0):  # a leased worker's items being worked
                return False
            if isinstance(snapshot, RouterStatistics) and any(
                queue.in_flight for queue in snapshot.domains
            ):
                return False
        return True


def _hypercorn_config() -> HypercornConfig:
    config = HypercornConfig()
    config.accesslog = None
    # Hypercorn's own lines go through our handlers (JSON or text), not a stream of its own.
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = 10.0
    return config


def _api_socket(settings: Settings, reuse_port: bool) -> socket.socket:
    """The API's listening socket; with `reuse_port`, one of several processes' on one port."""
    host, port = settings.api_listen
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if reuse_port:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind((host, port))
    sock.listen(socket.SOMAXCONN)
    return sock


class _Requests:
    """The HTTP requests being answered. Hypercorn keeps an idle keep-alive connection open
    through its whole grace period after a stop (its idle timer does not run after a Quart
    response), so the stop ends the HTTP server itself as soon as no request is in flight."""

    def __init__(self) -> None:
        self._count = 0
        self._none = trio.Event()
        self._none.set()

    def wrap(self, app: Any) -> Any:
        async def counted(scope: dict[str, Any], receive: Any, send: Any) -> None:
            if scope["type"] != "http":
                await app(scope, receive, send)
                return
            self._count += 1
            if self._count == 1:
                self._none = trio.Event()
            try:
                await app(scope, receive, send)
            finally:
                self._count -= 1
                if not self._count:
                    self._none.set()

        return counted

    async def none(self) -> None:
        """Return when no request is in flight."""
        while self._count:
            await self._none.wait()


async def _serve_http(
    app: Any,
    config: HypercornConfig,
    sock: socket.socket,
    shutdown: trio.Event,
    requests: _Requests,
    *,
    task_status: trio.TaskStatus[list[str]] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve the API on `sock` until `shutdown`; then let the requests in flight finish (for
    hypercorn's grace period at most) and close every connection, idle ones at once."""
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_end_http, shutdown, requests, config.graceful_timeout, scope)
            binds = await nursery.start(
                partial(
                    worker_serve,
                    wrap_app(app, config.wsgi_max_body_size, None),
                    config,
                    sockets=Sockets([], [sock], []),
                    shutdown_trigger=shutdown.wait,
                )
            )
            task_status.started(binds)


async def _end_http(
    shutdown: trio.Event, requests: _Requests, grace: float, scope: trio.CancelScope
) -> None:
    await shutdown.wait()
    with trio.move_on_after(grace):
        await requests.none()
    scope.cancel()


async def _drain_on(shutdown: trio.Event, actors: list[Draining], seconds: float) -> None:
    """On shutdown, let the SMTP transactions, webhook POSTs and forwards under way finish,
    for `seconds` at most."""
    await shutdown.wait()
    began = trio.current_time()
    with trio.move_on_after(seconds) as bounded:
        async with trio.open_nursery() as nursery:
            for actor in actors:
                nursery.start_soon(actor.drain)
    waited = trio.current_time() - began
    if bounded.cancelled_caught:
        log.warning("delivery did not drain in %.0f s: the rest is cut short", seconds)
    else:
        log.info("delivery drained in %.1f s", waited)


async def _stop_on(shutdown: trio.Event, listeners: list[SmtpListener]) -> None:
    await shutdown.wait()
    for listener in listeners:
        listener.stop()


async def serve(
    settings: Settings,
    *,
    reuse_port: bool = False,
    role: Role = "all",
    instance: str | None = None,
    task_status: trio.TaskStatus[RunningService] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Run the service until `stop()` is called or the task is cancelled: all of it, or one
    `role` of a worker of `postroom serve --workers N` (postroom/workers.py), whose workers
    form `instance`; `reuse_port` shares the listening ports with the other workers."""
    shutdown = trio.Event()
    async with open_database(settings.database_url) as db:
        rt = await open_runtime(db, settings)
        if interrupted := await fail_interrupted(rt):
            log.warning("%d broadcasts were cut short by the last stop: marked failed", interrupted)
        await nodes.register(rt, role, instance)
        log.info("node %s joined (%s)", rt.node, role)
        # Every node beats and hears the others; only a node that delivers runs the actors.
        keeper = nodes.NodeKeeper(rt)
        actors: list[Actor] = [keeper, WakeupRelay(rt.wakeups, db)]
        if role == "intake":
            rt.wakeups.close_actors()  # the delivery workers take the work it announces
        else:
            # The sandbox plugs into the webhooks and the forwarder: POSTs of sandboxed
            # workspaces are captured, never sent (neither imports the sandbox).
            captures = PostCaptures(rt)
            actors += [
                WebhookDispatcher(rt, settings.extra_ca_file, captures),
                DomainChecker(rt),
                Forwarder(rt, settings.extra_ca_file, captures),
                TransferTimer(rt),
                BroadcastRecovery(rt),
                SandboxOutcomes(rt),
                RetentionSweeper(rt),
                TlsReporter(rt),
                # Last: over a long queue it starts a queue per domain at once, whose claims
                # would hold up the others' first writes (and the start) behind them.
                # The sandbox answers its workspaces' mail before the SMTP egress sees it.
                DeliveryRouter(rt, [SandboxEgress(rt)]),
            ]
        draining = [a for a in actors if isinstance(a, Draining)]
        supervisor = Supervisor(actors, db, rt.faults)
        metrics = ServiceMetrics(rt, supervisor, instance)
        if instance is not None:  # the scrapes of the other workers add up what it publishes
            keeper.metrics = metrics.published
        async with trio.open_nursery() as engine:
            await engine.start(supervisor.run)
            async with trio.open_nursery() as stopping:
                if draining:
                    stopping.start_soon(_drain_on, shutdown, draining, settings.drain_seconds)
                if role == "delivery":
                    task_status.started(RunningService("", rt, shutdown.set, supervisor))
                    await shutdown.wait()
                else:
                    await _front_doors(
                        settings, rt, supervisor, metrics, reuse_port, shutdown, task_status
                    )
            # The front doors have closed and finished their requests and delivery has
            # drained; the actors' work is in the database and resumes on the next start (or
            # now, on another node).
            engine.cancel_scope.cancel()
        with trio.move_on_after(10):
            try:
                released = await nodes.stop(rt)
            except Exception as exc:
                if not is_outage(exc):
                    raise
                # Stopping during an outage is a clean stop all the same: what delivery kept
                # is in the spool, and the leases go when the cluster declares this node dead.
                log.warning(
                    "node %s left without the database (%s): its leases are freed when it"
                    " is declared dead",
                    rt.node,
                    exc,
                )
            else:
                log.info("node %s left, giving back %d leases", rt.node, released)
                log_left_behind(log, await db.read(backlog.read))


async def _front_doors(
    settings: Settings,
    rt: Runtime,
    supervisor: Supervisor,
    metrics: ServiceMetrics,
    reuse_port: bool,
    shutdown: trio.Event,
    task_status: trio.TaskStatus[RunningService],
) -> None:
    """Serve the API (with the MCP door) and the SMTP relay and MX until `shutdown`, then let
    the requests in flight finish."""
    relay_tls = await server_context(
        rt.db, settings.tls_cert, settings.tls_key, settings.smtp_host, rt.clock.now()
    )
    smtp_listeners = [
        submission_listener(rt, settings.submission_listen, relay_tls),
        inbound_listener(rt, settings.inbound_listen, relay_tls),
    ]
    for listener in smtp_listeners:
        listener.reuse_port = reuse_port
        metrics.add_source(listener.name, listener)
    metrics.add_source("message_memory", rt.message_memory)  # held, waiting, limit (bytes)
    app = create_app(rt, supervisor, metrics, settings.metrics_token)
    console.install(app)  # the web console at `/` (console/)
    mcp = HttpDoor(rt)  # /mcp on the API's port; it outlives the HTTP server's draining
    requests = _Requests()
    middleware: list[Callable[[ASGIApp], ASGIApp]] = [  # innermost first
        # The send door's common case is answered before Quart (api/send_edge.py).
        partial(send_edge, app, rt),
        # Every body's size and cut-short ending, for the send edge and Quart alike.
        partial(body_guard, limit=app.config["MAX_CONTENT_LENGTH"]),
        metrics.wrap,  # accept latency
        mcp.mount,  # /mcp on the API's port
        requests.wrap,  # counts requests in flight for the drain
    ]
    asgi = app.asgi_app
    for wrap in middleware:
        asgi = wrap(asgi)
    app.asgi_app = asgi  # type: ignore[method-assign]
    async with mcp.running(), trio.open_nursery() as front_doors:
        # Hypercorn serves a socket of ours, so that it can share its port.
        sock = _api_socket(settings, reuse_port)
        binds = await front_doors.start(
            _serve_http, app, _hypercorn_config(), sock, shutdown, requests
        )
        log.info("API listening on %s", binds[0])
        log.info(
            "Open the console at %s/ in a browser; %s",
            settings.public_url.rstrip("/"),
            "the sandbox is on: new workspaces capture their mail and nothing leaves this machine"
            if settings.sandbox
            else "the sandbox is off: mail is delivered",
        )
        submission_address, inbound_address = [
            await front_doors.start(listener.run) for listener in smtp_listeners
        ]
        front_doors.start_soon(_stop_on, shutdown, smtp_listeners)
        task_status.started(
            RunningService(
                binds[0],
                rt,
                shutdown.set,
                supervisor,
                submission_address=submission_address,
                inbound_address=inbound_address,
            )
        )
