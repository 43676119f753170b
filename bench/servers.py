"""The HTTP servers the benchmarks start besides `postroom serve`, all served the same way.

`python bench/servers.py noop PORT` serves the no-op Quart-Trio endpoint (the API's ceiling:
`POST /v1/emails/` reads the JSON body and answers 202, nothing else). `python
bench/servers.py api PORT` serves Postroom's own API app (api/app.py, with the metrics
wrapper, as `postroom serve` builds it) with delivery off: no actor but the node's heartbeat
and the wake-up relay, no SMTP listener, so the process does nothing but accept. `python bench/servers.py delivery`
runs the whole service beside such API processes (its own front doors on other ports) to
deliver what they accept; on SQLite, whose workers keep news of new mail to themselves (each
delivers what it accepted), it looks for new mail every `RESCAN_EVERY` seconds (PostgreSQL
wakes it by NOTIFY).

Both HTTP servers listen through `hypercorn.trio.worker_serve` on a socket made here with
SO_REUSEPORT, so `start(..., workers=N)` runs N processes on one port, as `postroom serve
--workers N` does; settings come from POSTROOM_* variables, as for the service.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

RESCAN_EVERY = 0.1  # seconds


def _socket(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(socket.SOMAXCONN)
    return sock


async def _serve(app: Any, port: int) -> None:
    from hypercorn.config import Config, Sockets
    from hypercorn.trio.run import worker_serve
    from hypercorn.utils import wrap_app

    config = Config()
    config.accesslog = None
    config.errorlog = None
    sockets = Sockets(secure_sockets=[], insecure_sockets=[_socket(port)], quic_sockets=[])
    print("ready", flush=True)  # the socket listens: connections wait for the first accept
    await worker_serve(wrap_app(app, config.wsgi_max_body_size, None), config, sockets=sockets)


async def noop(port: int) -> None:
    from quart import request
    from quart_trio import QuartTrio

    app = QuartTrio(__name__)

    @app.post("/v1/emails/")
    async def accept() -> tuple[dict[str, Any], int]:
        body = await request.get_json()
        return {"id": "00000000-0000-0000-0000-000000000000", "to": len(body["to"])}, 202

    await _serve(app, port)


async def api(port: int) -> None:
    from api.app import create_app
    from engine import nodes
    from engine.supervisor import Supervisor
    from engine.wakeups import WakeupRelay
    from postroom import config
    from postroom.metrics import ServiceMetrics
    from postroom.startup import open_runtime, settle_heap
    from storage.database import open_database

    settings = config.load(dict(os.environ))
    async with open_database(settings.database_url) as db:
        rt = await open_runtime(db, settings)
        await nodes.register(rt)
        # The relay tells the delivery process of new work (NOTIFY, or SQLite's _signals).
        supervisor = Supervisor([nodes.NodeKeeper(rt), WakeupRelay(rt.wakeups, db)], db, rt.faults)
        metrics = ServiceMetrics(db, supervisor)
        app = create_app(rt, supervisor, metrics, None)
        app.asgi_app = metrics.wrap(app.asgi_app)  # type: ignore[method-assign]
        async with trio.open_nursery() as nursery:
            await nursery.start(supervisor.run)
            settle_heap()  # as `postroom serve` does once started
            await _serve(app, port)


async def delivery() -> None:
    from postroom import config
    from postroom.service import serve
    from postroom.startup import settle_heap

    settings = config.load(dict(os.environ))
    async with trio.open_nursery() as nursery:
        running = await nursery.start(serve, settings)
        settle_heap()
        print("ready", flush=True)
        if settings.database_url.startswith("sqlite"):
            while True:
                await trio.sleep(RESCAN_EVERY)
                running.runtime.wakeups.deliver(["rescan"])


def start(kind: str, port: int, env: dict[str, str], cwd: str, workers: int = 1) -> list[Any]:
    """`workers` processes of `kind` (noop, api) on `port`, or one delivery process, once
    each is ready; stop them with `stop`."""
    command = [sys.executable, __file__, kind, str(port)]
    processes = [
        subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for _ in range(workers if kind != "delivery" else 1)
    ]
    for process in processes:
        if process.stdout is None or not process.stdout.readline():
            stop(processes)
            raise RuntimeError(f"bench/servers.py {kind} did not start")
    return processes


def stop(processes: list[Any]) -> None:
    for process in processes:
        process.terminate()
    for process in processes:
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def main() -> None:
    kind = sys.argv[1]
    if kind == "noop":
        trio.run(noop, int(sys.argv[2]))
    elif kind == "api":
        trio.run(api, int(sys.argv[2]))
    elif kind == "delivery":
        trio.run(delivery)
    else:
        raise SystemExit(f"unknown server {kind!r}: noop, api or delivery")


if __name__ == "__main__":
    main()
