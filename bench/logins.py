"""Reads under a login flood: `python bench/logins.py [--engines sqlite,postgresql]`.

Starts `postroom serve` in a child process and drives `GET /v1/api-keys/` (API-key auth,
one database read) with `bench/load.py` at a steady `--rate`, twice per run: alone, then
while `--logins` wrong-password logins for unknown addresses arrive evenly over the run from
20 loopback addresses (so the per-address limit stops none of them). Prints the reads' p50
and p99 in each case (median of `--runs` runs), what the logins were answered, and the
server's peak resident memory during each case (VmRSS sampled every 20 ms).

Argon2id (64 MiB, ~0.15 s of two cores each) runs on a small limiter of its own with a short
queue in front, so the reads should barely notice the flood and memory should stay flat;
before that, 80 such logins took a read from 4 ms to 9.8 s and the service to 2 GB.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_throughput import REPO
from bench.peers import bench_parser, memory_mib, postroom_process, until_healthy
from bench.stats import median_run

SOURCES = 20  # client addresses the flood comes from: 127.0.<run>.1-20


async def _ready(url: str) -> None:
    async with httpx.AsyncClient(base_url=url) as client:
        await until_healthy(client)


async def _reads(url: str, key: str, args: argparse.Namespace) -> dict[str, Any]:
    done = await trio.run_process(
        [
            sys.executable,
            str(REPO / "bench" / "load.py"),
            "--url",
            url + "/v1/api-keys/",
            "--key",
            key,
            "--concurrency",
            "10",
            "--rate",
            str(args.rate),
            "--seconds",
            str(args.seconds),
        ],
        capture_stdout=True,
    )
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def _flood(url: str, run: int, args: argparse.Namespace, statuses: Counter[int]) -> None:
    """`args.logins` wrong-password logins, spread evenly over the run's first 80%."""
    interval = args.seconds * 0.8 / args.logins
    clients = [
        httpx.AsyncClient(
            base_url=url,
            timeout=120,
            transport=httpx.AsyncHTTPTransport(local_address=f"127.0.{run + 1}.{source + 1}"),
        )
        for source in range(SOURCES)
    ]

    async def login(n: int) -> None:
        body = {"email": f"flood-{run}-{n}@example.org", "password": "not the password"}
        response = await clients[n % SOURCES].post("/v1/auth/login", json=body)
        statuses[response.status_code] += 1

    try:
        async with trio.open_nursery() as nursery:
            for n in range(args.logins):
                nursery.start_soon(login, n)
                await trio.sleep(interval)
    finally:
        for client in clients:
            await client.aclose()


async def _sample_resident(pid: int, peak: list[float]) -> None:
    """Keep `peak[0]` at the highest resident memory (VmRSS) seen, every 20 ms."""
    while True:
        peak[0] = max(peak[0], memory_mib(pid)["VmRSS"])
        await trio.sleep(0.02)


async def _case(
    url: str, key: str, pid: int, args: argparse.Namespace, flood: int | None
) -> dict[str, Any]:
    """Reads alone (`flood` None) or under the flood of run number `flood`."""
    peak = [0.0]
    statuses: Counter[int] = Counter()
    async with trio.open_nursery() as sampling:
        sampling.start_soon(_sample_resident, pid, peak)
        async with trio.open_nursery() as work:  # every login is answered before it ends
            if flood is not None:
                work.start_soon(_flood, url, flood, args, statuses)
            result = await _reads(url, key, args)
        sampling.cancel_scope.cancel()
    result["peak_mib"] = peak[0]
    if flood is not None:
        result["logins"] = dict(sorted(statuses.items()))
    return result


async def _one_run(
    url: str, key: str, pid: int, run: int, args: argparse.Namespace
) -> dict[str, dict[str, Any]]:
    return {
        "quiet": await _case(url, key, pid, args, None),
        "flooded": await _case(url, key, pid, args, run),
    }


async def measure(engine: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """For one engine: the median run of reads alone and of reads under the flood."""
    async with postroom_process(engine) as service:
        await _ready(service.url)
        runs = [
            await _one_run(service.url, service.key, service.pid, run, args)
            for run in range(args.runs)
        ]
    return {case: median_run([r[case] for r in runs], "p99_ms") for case in ("quiet", "flooded")}


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--logins", type=int, default=200)
    parser.add_argument("--rate", type=float, default=200.0, help="reads/s (all connections)")
    args = parser.parse_args()
    print(f"{'engine':<11}{'case':<9}{'reads/s':>8}{'p50 ms':>9}{'p99 ms':>9}{'peak MiB':>10}")
    for engine in args.engines.split(","):
        result = trio.run(measure, engine, args)
        for case, figures in result.items():
            logins = f"  logins: {figures['logins']}" if "logins" in figures else ""
            print(
                f"{engine:<11}{case:<9}{figures['rate']:>8.0f}{figures['p50_ms']:>9.1f}"
                f"{figures['p99_ms']:>9.1f}{figures['peak_mib']:>10.0f}"
                f"  (p99 of runs: {figures['runs']}){logins}",
                flush=True,
            )


if __name__ == "__main__":
    main()
