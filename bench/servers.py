"""The no-op Quart-Trio endpoint the benchmarks compare the API with, served as the service is.

`python bench/servers.py noop PORT` serves `POST /v1/emails/` that reads the JSON body and
answers 202, nothing else: the API's ceiling. It listens through `hypercorn.trio.worker_serve`
on a socket made here with SO_REUSEPORT, so `start("noop", port, env, cwd, workers=N)` runs N
processes on one port, as `postroom serve --workers N` does.
"""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


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


def start(port: int, env: dict[str, str], cwd: str, workers: int = 1) -> list[Any]:
    """`workers` no-op processes on `port`, once each is ready; stop them with `stop`."""
    command = [sys.executable, __file__, "noop", str(port)]
    processes = [
        subprocess.Popen(
            command, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
        )
        for _ in range(workers)
    ]
    for process in processes:
        if process.stdout is None or not process.stdout.readline():
            stop(processes)
            raise RuntimeError("bench/servers.py noop did not start")
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
    if kind != "noop":
        raise SystemExit(f"unknown server {kind!r}: noop")
    trio.run(noop, int(sys.argv[2]))


if __name__ == "__main__":
    main()
