"""End-to-end sending benchmark: `python bench/delivery.py [--engines sqlite,postgresql]`.

Starts `postroom serve` in a child process over a fresh database, with this process running
the project's test DNS server and SMTP sink on loopback (the recipients' MX). For each engine
it prints, as the median of `--runs` runs:

- accept:   POST /v1/emails/ (one recipient) requests/s with p50/p99 latency, while the
            delivery engine works at the same time;
- batch:    POST /v1/emails/batch of 100 emails, in emails/s;
- e2e:      emails/s from the first accept to the sink's 250 for the last of them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_throughput import CREATE_ACCOUNT, REPO, _database, _free_port
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

DOMAIN = "bench.example.org"


async def ready_to_send(api: httpx.AsyncClient, dns_server: DnsServer) -> None:
    """Wait for the service, then register DOMAIN (DKIM published, verified) and its sender."""
    for _ in range(300):
        try:
            if (await api.get("/healthz")).status_code == 200:
                break
        except httpx.TransportError:
            await trio.sleep(0.05)
    domain = (await api.post("/v1/domains/", json={"name": DOMAIN})).json()
    dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    await api.post(f"/v1/domains/{domain['id']}/verify")
    await api.post("/v1/senders/", json={"email": f"news@{DOMAIN}"})


def _body(n: str) -> dict[str, Any]:
    return {
        "from_": {"email": f"news@{DOMAIN}"},
        "to": [{"email": f"reader{n}@dest.example"}],
        "subject": "Benchmark",
        "text": "Hello from the benchmark.",
    }


async def _arrived(sink: SmtpSink, count: int, seconds: float) -> None:
    try:
        await sink.wait_for_messages(count, timeout=seconds)
    except trio.TooSlowError:
        print(f"  (the sink had {len(sink.messages)} of {count} after {seconds} s)", flush=True)


async def _load(
    url: str, key: str, path: str, body: str, seconds: float, start: int
) -> dict[str, Any]:
    command = [
        sys.executable,
        str(REPO / "bench" / "load.py"),
        "--url",
        url + path,
        "--method",
        "POST",
        "--body",
        body,
        "--key",
        key,
        "--concurrency",
        "50",
        "--seconds",
        str(seconds),
        "--start",
        str(start),
    ]
    done = await trio.run_process(command, capture_stdout=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


async def _run_engine(engine: str, args: argparse.Namespace) -> None:
    dns_server, sink = DnsServer(), SmtpSink()
    async with trio.open_nursery() as nursery:
        await nursery.start(dns_server.run)
        await nursery.start(sink.run)
        dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
        dns_server.set("mx.dest.example", "A", ["127.0.0.1"])
        with tempfile.TemporaryDirectory() as tmp, _database(engine, Path(tmp)) as db_url:
            port = _free_port()
            env = {
                "POSTROOM_DATABASE_URL": db_url,
                "POSTROOM_API_LISTEN": f"127.0.0.1:{port}",
                "POSTROOM_DNS_SERVERS": dns_server.nameserver,
                "POSTROOM_DELIVERY_PORT": str(sink.port),
                "PYTHONPATH": str(REPO),
                "PATH": "/usr/bin:/bin",
            }
            cli = [sys.executable, "-m", "postroom"]
            created = await trio.run_process(
                [*cli, *CREATE_ACCOUNT], env=env, cwd=tmp, capture_stdout=True
            )
            key = json.loads(created.stdout)["api_key"]
            server = await trio.lowlevel.open_process(
                [*cli, "serve"], env=env, cwd=tmp, stderr=subprocess.DEVNULL
            )
            url = f"http://127.0.0.1:{port}"
            try:
                async with httpx.AsyncClient(
                    base_url=url, headers={"Authorization": f"Bearer {key}"}
                ) as api:
                    await ready_to_send(api, dns_server)
                accepts, batches, e2e = [], [], []
                single = json.dumps(_body("{n}"))
                batch = json.dumps([_body(f"{{n}}-{i}") for i in range(100)])
                for run in range(args.runs):
                    before = len(sink.messages)
                    started = time.perf_counter()
                    result = await _load(url, key, "/v1/emails/", single, args.seconds, run * 10**7)
                    accepted = result["statuses"].get("202", 0)
                    await _arrived(sink, before + accepted, 120)
                    e2e.append((len(sink.messages) - before) / (time.perf_counter() - started))
                    accepts.append(result)
                    before = len(sink.messages)
                    result = await _load(
                        url, key, "/v1/emails/batch", batch, args.seconds, 5 * 10**8 + run * 10**7
                    )
                    batches.append(result["rate"] * 100)
                    await _arrived(sink, before + result["statuses"].get("202", 0) * 100, 300)
                median = sorted(accepts, key=lambda r: r["rate"])[len(accepts) // 2]
                print(
                    f"{engine:<11} accept {median['rate']:>7.0f} req/s  p50 {median['p50_ms']:.1f} ms"
                    f"  p99 {median['p99_ms']:.1f} ms   batch {statistics.median(batches):>7.0f} emails/s"
                    f"   e2e {statistics.median(e2e):>6.0f} emails/s   (sink got {len(sink.messages)})",
                    flush=True,
                )
            finally:
                server.terminate()
                await server.wait()
        nursery.cancel_scope.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        trio.run(_run_engine, engine, args)


if __name__ == "__main__":
    main()
