"""API throughput on SQLite and PostgreSQL: `python bench/api_throughput.py`.

Starts `postroom serve` in a child process over a fresh database, creates an account with the
CLI, then drives each scenario with `wrk` (bench/wrk.py: a C load generator in its own
process) and prints requests/s, p50/p99 latency and the service's CPU milliseconds per
request, the median of `--runs` runs:

- healthz:        GET /healthz (no auth, one database read)
- list-keys:      GET /v1/api-keys/ (key auth from cache, one read)
- add-suppression: POST /v1/suppressions/ (auth, validation, durable group commit + log entry)
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import wrk

REPO = Path(__file__).resolve().parents[1]
# `postroom` arguments for the benchmark's account (Business: no plan limit gets in the way).
CREATE_ACCOUNT = (
    "accounts",
    "create",
    "--email",
    "bench@example.org",
    "--password",
    "benchmark1",
    "--plan",
    "business",
)
SCENARIOS = {
    "healthz": ("GET", "/healthz", ""),
    "list-keys": ("GET", "/v1/api-keys/", ""),
    "add-suppression": ("POST", "/v1/suppressions/", '{"email": "bench-{n}@example.org"}'),
}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def _database(engine: str, workdir: Path) -> Iterator[str]:
    if engine == "sqlite":
        yield f"sqlite:///{workdir / 'bench.db'}"
        return
    import psycopg

    admin = os.environ.get("POSTROOM_TEST_POSTGRES", "postgresql://root@127.0.0.1:5432/postgres")
    name = "postroom_bench_" + secrets.token_hex(4)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    try:
        yield admin.rpartition("/")[0] + "/" + name
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@contextmanager
def _service(database_url: str, workdir: Path) -> Iterator[tuple[str, str, int]]:
    port = _free_port()
    env = {
        **os.environ,
        "POSTROOM_DATABASE_URL": database_url,
        "POSTROOM_API_LISTEN": f"127.0.0.1:{port}",
        "PYTHONPATH": str(REPO),
    }
    cli = [sys.executable, "-m", "postroom"]
    created = subprocess.run(
        [*cli, *CREATE_ACCOUNT], env=env, cwd=workdir, check=True, capture_output=True, text=True
    )
    key = json.loads(created.stdout)["api_key"]
    server = subprocess.Popen(
        [*cli, "serve", "--workers", "1"], env=env, cwd=workdir, stderr=subprocess.DEVNULL
    )
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(300):
            try:
                if httpx.get(url + "/healthz").status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.05)
        yield url, key, server.pid
    finally:
        server.terminate()
        server.wait(timeout=30)


def _load(
    url: str, pid: int, scenario: str, key: str, args: argparse.Namespace, start: int
) -> dict[str, Any]:
    method, path, body = SCENARIOS[scenario]
    cpu = wrk.cpu_seconds(pid)
    result = wrk.load(
        url,
        path=path,
        method=method,
        body=body,
        key=key,
        connections=args.concurrency,
        seconds=args.seconds,
        start=start,
    )
    result["cpu_ms"] = (wrk.cpu_seconds(pid) - cpu) * 1000 / max(result["requests"], 1)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=50)
    args = parser.parse_args()
    print(
        f"{'engine':<11}{'scenario':<17}{'req/s':>9}{'p50 ms':>9}{'p99 ms':>9}{'CPU ms':>9}  non-2xx"
    )
    for engine in args.engines.split(","):
        with (
            tempfile.TemporaryDirectory() as tmp,
            _database(engine, Path(tmp)) as db_url,
            _service(db_url, Path(tmp)) as (url, key, pid),
        ):
            for scenario in args.scenarios.split(","):
                runs = [
                    _load(url, pid, scenario, key, args, start=run * 10_000_000)
                    for run in range(args.runs)
                ]
                median = sorted(runs, key=lambda r: r["rate"])[len(runs) // 2]
                rates = ", ".join(f"{run['rate']:.0f}" for run in runs)
                print(
                    f"{engine:<11}{scenario:<17}{median['rate']:>9.0f}{median['p50_ms']:>9.1f}"
                    f"{median['p99_ms']:>9.1f}{median['cpu_ms']:>9.2f}  {median['non_2xx']}"
                    f"  (runs: {rates})",
                    flush=True,
                )


if __name__ == "__main__":
    main()
