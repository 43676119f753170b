"""`postroom serve --workers N`: N service processes sharing the database, one per core.

The workers split the work in two roles (`--delivery-workers M`, default half of them):
intake workers take mail (the API, the SMTP relay and the inbound MX, listening on the same
ports with SO_REUSEPORT so the kernel spreads connections between them) and delivery workers
deliver it and run the other actors (webhooks, forwards, domain checks, timers). The kernel
shares the cores fairly between the two roles, where a Trio loop that did both let a flood of
accepts starve its own delivery: measured end to end, the split was faster in every run on
both engines (docs/decisions.md). `--delivery-workers 0` makes every worker do both.

The parent does no serving. It applies the migrations and installs the master key once (so
workers never race to), fixes the ports (a port given as 0 is chosen here and reserved with a
bound, non-listening socket), then starts N `postroom serve --workers 1` children, each in its role.
Each child is a node of its own (engine/platform/nodes.py): leases, connection slots and limits live
in the database, so the workers share the work exactly as several hosts would. Together they
are one instance (an id given to each), whose figures a scrape of `/metrics` adds up
(postroom/metrics.py).

A child that dies is started again after a back-off (a kill -9 loses nothing: its work is
freed when it is reaped). SIGTERM or SIGINT to the parent stops every child cleanly and the
parent exits when they have. A child dies with its parent (PR_SET_PDEATHSIG), so no worker
outlives a killed supervisor.
"""

from __future__ import annotations

import ctypes
import logging
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import trio

from engine.platform.nodes import Role, new_node_id
from postroom.config import Settings
from postroom.startup import open_runtime
from storage.database import open_database

log = logging.getLogger("postroom")

BACKOFF_FIRST = 1.0  # seconds before a dead worker is started again, doubling
BACKOFF_MAX = 30.0
# Seconds workers get to stop cleanly beyond their drain time (POSTROOM_DRAIN_SECONDS) before
# they are killed: leaving the cluster, closing the database.
STOP_MARGIN = 10.0
_PR_SET_PDEATHSIG = 1


def default_workers() -> int:
    """One worker per core this process may run on."""
    return len(os.sched_getaffinity(0))


def roles(count: int, delivering: int | None) -> list[Role]:
    """The role of each of `count` workers, `delivering` of them delivery workers (default:
    half, rounded down); a ValueError says why a split cannot be made."""
    if delivering is None:
        delivering = count // 2
    if delivering == 0:
        return ["all"] * count
    if delivering >= count:
        raise ValueError(
            f"--delivery-workers {delivering} leaves no worker to take mail:"
            f" use --workers {delivering + 1} or more, or fewer delivery workers"
        )
    intake: list[Role] = ["intake"]
    delivery: list[Role] = ["delivery"]
    return intake * (count - delivering) + delivery * delivering


async def _prepare(settings: Settings) -> None:
    async with open_database(settings.database_url) as db:
        await open_runtime(db, settings)


def _reserve(address: tuple[str, int]) -> socket.socket:
    """Fix a listening address's port (0 picks one), reserved by a socket that never listens."""
    host, port = address
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    return sock


def _listen_value(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _this_program() -> list[str]:
    """How this process was started, up to its own arguments (`python -m postroom`, the
    single-file build `python -I postroom.pyz`, or the `postroom` script), to start the
    workers the same way."""
    program = sys.orig_argv[: len(sys.orig_argv) - len(sys.argv) + 1]
    return [sys.executable, *program[1:]]


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL it when the parent dies."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class Workers:
    def __init__(
        self, roles: list[Role], env: dict[str, str], config: Path | None, stop_timeout: float
    ) -> None:
        self._roles = roles
        self._stop_timeout = stop_timeout
        self._env = env
        self._argv = _this_program()
        if config is not None:
            self._argv += ["--config", str(config)]
        # The workers form one instance: a scrape of any adds up the figures of all.
        instance = new_node_id()
        self._argv += ["serve", "--workers", "1", "--reuse-port", "--instance", instance]
        self._children: list[subprocess.Popen[bytes] | None] = [None] * len(roles)
        self._signal: int | None = None  # set by the handler; acted on by the loop

    def _start(self, index: int) -> None:
        self._children[index] = subprocess.Popen(
            [*self._argv, "--role", self._roles[index]],
            env=self._env,
            preexec_fn=_die_with_parent,
        )

    def _note(self, signum: int, frame: object) -> None:
        self._signal = signum

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._note)
        signal.signal(signal.SIGINT, self._note)
        for index in range(len(self._roles)):
            self._start(index)
        log.info(
            "started %d workers: %s",
            len(self._roles),
            ", ".join(f"{self._roles.count(r)} {r}" for r in dict.fromkeys(self._roles)),
        )
        backoff = [BACKOFF_FIRST] * len(self._roles)
        restart_at: dict[int, float] = {}
        while self._signal is None:
            time.sleep(0.2)
            for index, child in enumerate(self._children):
                if self._signal is not None or child is None or child.poll() is None:
                    continue
                if index not in restart_at:
                    log.error(
                        "worker %d (pid %d) exited with %s; starting it again in %.0f s",
                        index,
                        child.pid,
                        child.returncode,
                        backoff[index],
                    )
                    restart_at[index] = time.monotonic() + backoff[index]
                    backoff[index] = min(backoff[index] * 2, BACKOFF_MAX)
                elif time.monotonic() >= restart_at[index]:
                    del restart_at[index]
                    self._start(index)
        name = signal.Signals(self._signal).name
        log.info("%s, stopping %d workers", name, len(self._roles), extra={"signal": name})
        for child in self._children:
            if child is not None and child.poll() is None:
                child.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self._stop_timeout
        for child in self._children:
            if child is None:
                continue
            try:
                child.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                child.kill()
                child.wait()
        return 0


def run(settings: Settings, roles: list[Role], config: Path | None) -> int:
    """Serve with a worker process in each of `roles` until SIGTERM or SIGINT; the exit
    status."""
    trio.run(_prepare, settings)  # migrations and the master key, once, before any worker
    reserved = [
        _reserve(address)
        for address in (settings.api_listen, settings.submission_listen, settings.inbound_listen)
    ]
    env = dict(os.environ)
    for name, sock in zip(("API", "SUBMISSION", "INBOUND"), reserved, strict=True):
        env[f"POSTROOM_{name}_LISTEN"] = _listen_value(sock)
    try:
        return Workers(roles, env, config, settings.drain_seconds + STOP_MARGIN).run()
    finally:
        for sock in reserved:
            sock.close()
