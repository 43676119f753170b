"""A small HTTP/1.1 keep-alive load generator (Trio + h11), run in its own process.

Each of `--concurrency` connections sends requests back to back for `--seconds` (or, with
`--rate`, paced so that all of them together send that many per second) and records
per-request latency. Prints one JSON object: requests, errors, rate and latency percentiles.
The request body may contain `{n}`, replaced by a unique number per request.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from urllib.parse import urlsplit

import h11
import trio


async def _connection(
    host: str,
    port: int,
    method: str,
    path: str,
    headers: list[tuple[str, str]],
    body: str,
    deadline: float,
    counter: itertools.count[int],
    latencies: list[float],
    statuses: dict[int, int],
    interval: float,
) -> None:
    stream = await trio.open_tcp_stream(host, port)
    async with stream:
        conn = h11.Connection(h11.CLIENT)
        next_send = time.perf_counter()
        while time.perf_counter() < deadline:
            if interval:
                next_send += interval
                await trio.sleep(max(0.0, next_send - time.perf_counter()))
            payload = body.replace("{n}", str(next(counter))).encode()
            request_headers = [("Host", host), ("Content-Length", str(len(payload))), *headers]
            started = time.perf_counter()
            await stream.send_all(
                conn.send(h11.Request(method=method, target=path, headers=request_headers))
                + conn.send(h11.Data(data=payload))
                + conn.send(h11.EndOfMessage())
            )
            status = 0
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    conn.receive_data(await stream.receive_some(65536))
                    continue
                if isinstance(event, h11.Response):
                    status = event.status_code
                if isinstance(event, h11.EndOfMessage):
                    break
            latencies.append(time.perf_counter() - started)
            statuses[status] = statuses.get(status, 0) + 1
            conn.start_next_cycle()


async def run(args: argparse.Namespace) -> dict[str, object]:
    url = urlsplit(args.url)
    headers = [("Content-Type", "application/json")]
    if args.key:
        headers.append(("Authorization", f"Bearer {args.key}"))
    latencies: list[float] = []
    statuses: dict[int, int] = {}
    counter = itertools.count(args.start)
    started = time.perf_counter()
    deadline = started + args.seconds
    interval = args.concurrency / args.rate if args.rate else 0.0
    async with trio.open_nursery() as nursery:
        for _ in range(args.concurrency):
            nursery.start_soon(
                _connection,
                url.hostname,
                url.port,
                args.method,
                url.path or "/",
                headers,
                args.body,
                deadline,
                counter,
                latencies,
                statuses,
                interval,
            )
            if interval:
                await trio.sleep(interval / args.concurrency)  # spread the connections out
    elapsed = time.perf_counter() - started
    quantiles = statistics.quantiles(latencies, n=100) if len(latencies) > 1 else [0.0] * 99
    return {
        "requests": len(latencies),
        "statuses": statuses,
        "rate": len(latencies) / elapsed,
        "p50_ms": quantiles[49] * 1000,
        "p99_ms": quantiles[98] * 1000,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--method", default="GET")
    parser.add_argument("--body", default="")
    parser.add_argument("--key", default="")
    parser.add_argument("--concurrency", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--start", type=int, default=0, help="first value of {n}")
    parser.add_argument("--rate", type=float, default=0.0, help="requests/s in all (0: flat out)")
    print(json.dumps(trio.run(run, parser.parse_args())))


if __name__ == "__main__":
    main()
