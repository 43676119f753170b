"""HTTP accept and end-to-end figures with wrk as the load generator: `python bench/accept.py`.

For each engine and each way of serving it (a fresh database each), with this process running
the test DNS server and SMTP sink on loopback (the recipients' MX):

- one:    `postroom serve --workers 1`: the API and delivery in ONE process, which accepts
          while it delivers (the service as one process runs it);
- split:  `postroom serve` as shipped: one worker process per core, half of them (rounded
          down) delivering what the others accept (on 2 cores: the API in one process,
          delivery in ANOTHER);
- cores:  `postroom serve --delivery-workers 0`: one worker process per core, each
          accepting and delivering;
- no-op:  the no-op Quart-Trio endpoint (`bench/servers.py noop`), one process or one per
          core, served the same way: the ceiling the accept rate is compared with.

Figures of a mode: POST /v1/emails/ with one unique recipient per request (wrk's Lua script,
50 connections) flat out: requests/s, p50/p99; p99 with the load paced at half that rate;
POST /v1/emails/batch of 100 emails: emails/s; end to end: emails/s from the first accept of
the flat-out run to the sink's 250 for the last of them. Next to each rate, the CPU the
service's processes spent (all of them, read from /proc): milliseconds per email and cores
used (CPU seconds over wall seconds).

`--profile DIR` samples every process of the service with py-spy during the first flat-out
single and batch runs of each mode and writes DIR/<engine>-<mode>[-batch].txt (collapsed
stacks; each process's own in DIR/…-<pid>.process) and .emails (how many were accepted
meanwhile): `python bench/profile_steps.py DIR` says where the CPU went.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import servers, wrk
from bench.api_throughput import CREATE_ACCOUNT, REPO, _database, _free_port
from bench.delivery import DOMAIN, ready_to_send
from bench.peers import RECIPIENT_DOMAIN, bench_parser, loopback_mail
from bench.stats import median
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

MODES = ("one", "split", "cores")
SERVE = {
    "one": ["--workers", "1"],
    "split": [],
    "cores": ["--delivery-workers", "0"],
}
CONNECTIONS = 50
# Batches go on fewer connections: 50 requests of 100 emails would be 5,000 in flight.
BATCH_CONNECTIONS = 8
BATCH = 100


def _email(n: str) -> dict[str, Any]:
    return {
        "from_": {"email": f"news@{DOMAIN}"},
        "to": [{"email": f"reader{n}@{RECIPIENT_DOMAIN}"}],
        "subject": "Benchmark",
        "text": "Hello from the benchmark.",
    }


SINGLE = json.dumps(_email("{n}"))
BATCH_BODY = json.dumps([_email(f"{{n}}-{i}") for i in range(BATCH)])


@dataclass(frozen=True, slots=True)
class Served:
    url: str
    key: str
    pids: list[int]


def _env(database_url: str, dns_server: DnsServer, sink: SmtpSink) -> dict[str, str]:
    return {
        "POSTROOM_DATABASE_URL": database_url,
        "POSTROOM_API_LISTEN": f"127.0.0.1:{_free_port()}",
        "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{_free_port()}",
        "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{_free_port()}",
        "POSTROOM_DNS_SERVERS": dns_server.nameserver,
        "POSTROOM_DELIVERY_PORT": str(sink.port),
        # The sink's MX is on loopback, which the private-network rule refuses by default.
        "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
        "PYTHONPATH": str(REPO),
        "PATH": "/usr/bin:/bin",
    }


def _stop(processes: list[subprocess.Popen[bytes]]) -> None:
    servers.stop(processes)


@asynccontextmanager
async def serving(
    engine: str, mode: str, dns_server: DnsServer, sink: SmtpSink
) -> AsyncIterator[Served]:
    """Postroom served in `mode` over a fresh database, its domain verified and sender set."""
    with tempfile.TemporaryDirectory() as tmp, _database(engine, Path(tmp)) as db_url:
        env = _env(db_url, dns_server, sink)
        cli = [sys.executable, "-m", "postroom"]
        created = await trio.run_process(
            [*cli, *CREATE_ACCOUNT], env=env, cwd=tmp, capture_stdout=True
        )
        key = json.loads(created.stdout)["api_key"]
        url = "http://" + env["POSTROOM_API_LISTEN"]
        processes: list[Any] = []
        try:
            serve = [*cli, "serve", *SERVE[mode]]
            popen = partial(subprocess.Popen, serve, env=env, cwd=tmp, stderr=subprocess.DEVNULL)
            processes.append(await trio.to_thread.run_sync(popen))
            async with httpx.AsyncClient(
                base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
            ) as api:
                await ready_to_send(api, dns_server)
            yield Served(url, key, [p.pid for p in processes])
        finally:
            await trio.to_thread.run_sync(_stop, processes)


@asynccontextmanager
async def noop_serving(workers: int) -> AsyncIterator[Served]:
    port = _free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    start = partial(servers.start, port, env, str(REPO), workers)
    processes = await trio.to_thread.run_sync(start)
    try:
        yield Served(f"http://127.0.0.1:{port}", "", [p.pid for p in processes])
    finally:
        await trio.to_thread.run_sync(_stop, processes)


def _cpu(pids: list[int]) -> float:
    return sum(wrk.cpu_seconds(pid) for pid in pids)


async def _wrk(
    served: Served,
    path: str,
    body: str,
    seconds: float,
    connections: int = CONNECTIONS,
    **options: Any,
) -> Any:
    """One wrk run, with the CPU the service's processes spent during it."""
    cpu = _cpu(served.pids)
    load = partial(
        wrk.load,
        served.url,
        path=path,
        method="POST",
        body=body,
        key=served.key,
        connections=connections,
        seconds=seconds,
        **options,
    )
    result: dict[str, Any] = await trio.to_thread.run_sync(load)
    result["cpu_s"] = _cpu(served.pids) - cpu
    result["cores"] = result["cpu_s"] / result["seconds"]
    return result


def _py_spy(pid: int, out: Path) -> subprocess.Popen[bytes]:
    """py-spy sampling `pid` (all its threads) 100 times a second into `out` until SIGINT."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    command = [spy, "record", "--nonblocking", "-r", "100", "-f", "raw", "-p", str(pid)]
    return subprocess.Popen(
        [*command, "-o", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def _stop_spies(spies: list[subprocess.Popen[bytes]], parts: list[Path], out: Path) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled
    for spy in spies:
        spy.wait(timeout=60)
    # Collapsed stacks of several processes simply add up.
    out.write_text("".join(part.read_text() for part in parts if part.exists()))
    for part in parts:  # kept per process (.part) for a look at one process alone
        if part.exists():
            part.rename(part.with_suffix(".process"))


async def _drained(sink: SmtpSink, count: int, seconds: float) -> bool:
    try:
        await sink.wait_for_messages(count, timeout=seconds)
        return True
    except trio.TooSlowError:
        print(f"  (the sink had {len(sink.messages)} of {count} after {seconds} s)", flush=True)
        return False


async def noop_figures(runs: int, seconds: float, workers: int = 1) -> dict[str, Any]:
    """The no-op endpoint in `workers` processes flat out: requests/s, p99, CPU ms/request."""
    found = []
    async with noop_serving(workers) as served:
        await _wrk(served, "/v1/emails/", SINGLE, 1)  # warm
        for run in range(runs):
            found.append(await _wrk(served, "/v1/emails/", SINGLE, seconds, start=run * 10**7))
    best = sorted(found, key=lambda r: r["rate"])[len(found) // 2]
    return {
        "rate": best["rate"],
        "p99_ms": best["p99_ms"],
        "cpu_ms": best["cpu_s"] * 1000 / max(best["requests"], 1),
        "cores": best["cores"],
    }


async def mode_figures(
    engine: str, mode: str, runs: int, seconds: float, profile: Path | None = None
) -> dict[str, Any]:
    """Every figure of one engine served in one mode (see the module's header); with
    `profile`, py-spy samples the first flat-out run into that folder."""
    singles, halves, batches, e2e = [], [], [], []
    async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, sink):
        async with serving(engine, mode, dns_server, sink) as served:
            for run in range(runs):
                before = len(sink.messages)
                spies: list[subprocess.Popen[bytes]] = []
                parts: list[Path] = []
                if profile is not None and run == 0:
                    pids = [p for pid in served.pids for p in wrk.process_tree(pid)]
                    parts = [profile / f"{engine}-{mode}-{pid}.part" for pid in pids]
                    spies = [_py_spy(pid, part) for pid, part in zip(pids, parts, strict=True)]
                started = time.perf_counter()
                single = await _wrk(served, "/v1/emails/", SINGLE, seconds, start=run * 10**7)
                accepted = single["requests"] - single["non_2xx"] - single["socket_errors"]
                if spies and profile is not None:
                    stop = partial(_stop_spies, spies, parts, profile / f"{engine}-{mode}.txt")
                    await trio.to_thread.run_sync(stop)
                    (profile / f"{engine}-{mode}.emails").write_text(str(accepted))
                if await _drained(sink, before + accepted, 120):
                    e2e.append(accepted / (time.perf_counter() - started))
                single["cpu_ms"] = single["cpu_s"] * 1000 / max(accepted, 1)
                singles.append(single)
                half = await _wrk(
                    served,
                    "/v1/emails/",
                    SINGLE,
                    seconds,
                    start=2 * 10**8 + run * 10**7,
                    rate=single["rate"] / 2,
                )
                halves.append(half)
                if profile is not None and run == 0:
                    parts = [profile / f"{engine}-{mode}-batch-{pid}.part" for pid in pids]
                    spies = [_py_spy(pid, part) for pid, part in zip(pids, parts, strict=True)]
                batch = await _wrk(
                    served,
                    "/v1/emails/batch",
                    BATCH_BODY,
                    seconds,
                    BATCH_CONNECTIONS,
                    start=5 * 10**8 + run * 10**7,
                )
                emails = (batch["requests"] - batch["non_2xx"]) * BATCH
                if spies and profile is not None:
                    stop = partial(
                        _stop_spies, spies, parts, profile / f"{engine}-{mode}-batch.txt"
                    )
                    await trio.to_thread.run_sync(stop)
                    (profile / f"{engine}-{mode}-batch.emails").write_text(str(emails))
                batch["emails_per_s"] = emails / batch["seconds"]
                batch["cpu_ms"] = batch["cpu_s"] * 1000 / max(emails, 1)
                batches.append(batch)
                if run + 1 < runs:  # the backlog goes out before the next run
                    await _drained(sink, before + accepted + emails, 60)
        nursery.cancel_scope.cancel()
    single = sorted(singles, key=lambda r: r["rate"])[len(singles) // 2]
    batch = sorted(batches, key=lambda r: r["emails_per_s"])[len(batches) // 2]
    return {
        "engine": engine,
        "mode": mode,
        "accept_rate": single["rate"],
        "accept_p50_ms": single["p50_ms"],
        "accept_p99_ms": single["p99_ms"],
        "accept_cpu_ms": single["cpu_ms"],
        "accept_cores": single["cores"],
        "accept_errors": single["non_2xx"] + single["socket_errors"],
        "accept_runs": ", ".join(f"{r['rate']:.0f}" for r in singles),
        "half_rate_p99_ms": median([h["p99_ms"] for h in halves]),
        "batch_emails_per_s": batch["emails_per_s"],
        "batch_cpu_ms": batch["cpu_ms"],
        "batch_cores": batch["cores"],
        "batch_errors": batch["non_2xx"] + batch["socket_errors"],
        "batch_requests": batch["requests"],
        "e2e_per_s": median(e2e) if e2e else 0.0,
        "e2e_messages": int(single["requests"]),
    }


def line(r: dict[str, Any]) -> str:
    """One mode's figures on a line."""
    return (
        f"{r['engine']:<11}{r['mode']:<6} accept {r['accept_rate']:>5.0f} req/s"
        f" ({r['accept_cpu_ms']:.2f} ms CPU/email, {r['accept_cores']:.2f} cores,"
        f" p50 {r['accept_p50_ms']:.0f} ms, p99 {r['accept_p99_ms']:.0f} ms,"
        f" p99 at half rate {r['half_rate_p99_ms']:.0f} ms)"
        f"  batch {r['batch_emails_per_s']:>6.0f} emails/s ({r['batch_cpu_ms']:.2f} ms CPU/email,"
        f" {r['batch_requests']} requests, {r['batch_errors']} refused)"
        f"  e2e {r['e2e_per_s']:>4.0f} emails/s  (runs: {r['accept_runs']})"
    )


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--modes", default=",".join(MODES))
    parser.add_argument("--profile", type=Path, help="py-spy the first flat-out run into DIR")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    missing = wrk.missing()
    if missing is not None:
        raise SystemExit(missing)
    for workers in sorted({1, os.cpu_count() or 1}):
        noop = trio.run(noop_figures, args.runs, args.seconds, workers)
        print(
            f"no-op      {workers} process(es) {noop['rate']:>5.0f} req/s"
            f" ({noop['cpu_ms']:.2f} ms CPU/request, {noop['cores']:.2f} cores)",
            flush=True,
        )
    for engine in args.engines.split(","):
        for mode in args.modes.split(","):
            found = trio.run(mode_figures, engine, mode, args.runs, args.seconds, args.profile)
            print(line(found), flush=True)


if __name__ == "__main__":
    main()
