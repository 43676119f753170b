"""CPU per webhook POST of the outbound HTTP clients: `python bench/http_clients.py`.

The choice of the client behind webhooks and forwards (engine/platform/outbound_http.py) rests on this
figure. The receiver (tests/harness/https_receiver.py, TLS with a trustme certificate) runs in
a child process, so the CPU time measured here is the client's alone: `--posts` signed-sized
POSTs from `--tasks` concurrent tasks to one origin over at most 16 keep-alive connections,
for each client:

- httpx:  httpx 0.28 with HTTP/1.1 keep-alive tuned (16 connections kept, 5 s expiry) and a
          capacity limiter of 16 in front of its pool, so no request waits inside httpcore's
          pool (its wait rescans every connection for every waiting request);
- http1:  engine/platform/http1_client.py, a pooled keep-alive client on h11.

It prints POSTs/s and CPU milliseconds per POST, the median of `--runs` runs each.
"""

from __future__ import annotations

import argparse
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from engine.platform.http1_client import Client
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.tls import make_authority

BODY = b'{"type": "email.delivered", "data": {"email_id": "' + b"0" * 36 + b'"}}' + b" " * 300
HEADERS = {"Content-Type": "application/json", "X-Webhook-Signature": "0" * 64}
PER_ORIGIN = 16

Post = Callable[[str], Awaitable[int]]


async def _receiver(folder: Path) -> None:
    authority = make_authority(folder)
    receiver = HttpsReceiver(authority.server_context())
    async with trio.open_nursery() as nursery:
        port = await nursery.start(receiver.run)
        print(port, flush=True)
        await trio.sleep_forever()


def _httpx(tls: ssl.SSLContext) -> tuple[Post, Callable[[], Awaitable[None]]]:
    limits = httpx.Limits(
        max_connections=PER_ORIGIN, max_keepalive_connections=PER_ORIGIN, keepalive_expiry=5.0
    )
    transport = httpx.AsyncHTTPTransport(verify=tls, limits=limits)
    client = httpx.AsyncClient(transport=transport, timeout=10.0, follow_redirects=False)
    limiter = trio.CapacityLimiter(PER_ORIGIN)

    async def post(url: str) -> int:
        async with limiter:
            return (await client.post(url, content=BODY, headers=HEADERS)).status_code

    return post, client.aclose


def _http1(tls: ssl.SSLContext) -> tuple[Post, Callable[[], Awaitable[None]]]:
    async def connect(host: str, port: int) -> trio.SocketStream:
        return await trio.open_tcp_stream(host, port)

    client = Client(tls, connect, PER_ORIGIN)

    async def post(url: str) -> int:
        return (await client.post(url, BODY, HEADERS)).status

    return post, client.aclose


async def _run(
    kind: str, url: str, tls: ssl.SSLContext, posts: int, tasks: int
) -> tuple[float, float]:
    post, close = (_httpx if kind == "httpx" else _http1)(tls)
    for _ in range(PER_ORIGIN):  # warm: the connections are open before the clock starts
        await post(url)
    left = posts
    failed = 0

    async def worker() -> None:
        nonlocal left, failed
        while left > 0:
            left -= 1
            if await post(url) != 200:
                failed += 1

    cpu, wall = time.process_time(), time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(tasks):
            nursery.start_soon(worker)
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    await close()
    if failed:
        raise RuntimeError(f"{kind}: {failed} POSTs were not answered 200")
    return posts / wall, cpu / posts * 1000


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--posts", type=int, default=3000)
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--clients", default="httpx,http1")
    parser.add_argument("--receiver", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver is not None:
        trio.run(_receiver, args.receiver)
        return
    with tempfile.TemporaryDirectory() as tmp:
        child = subprocess.Popen(
            [sys.executable, __file__, "--receiver", tmp], stdout=subprocess.PIPE, text=True
        )
        try:
            assert child.stdout is not None
            url = f"https://localhost:{int(child.stdout.readline())}/hook"
            tls = ssl.create_default_context(cafile=str(Path(tmp) / "test-ca.pem"))
            for kind in args.clients.split(","):
                figures = [
                    trio.run(_run, kind, url, tls, args.posts, args.tasks) for _ in range(args.runs)
                ]
                rate = statistics.median(f[0] for f in figures)
                cpu = statistics.median(f[1] for f in figures)
                runs = ", ".join(f"{f[1]:.2f}" for f in figures)
                print(
                    f"{kind:<6} {rate:>6.0f} POSTs/s  {cpu:.2f} ms CPU per POST  (runs: {runs})",
                    flush=True,
                )
        finally:
            child.terminate()
            child.wait()


if __name__ == "__main__":
    main()
