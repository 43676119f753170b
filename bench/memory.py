"""A large queue: `python bench/memory.py [--engines sqlite,postgresql] [--emails 1000000]`.

Writes `--emails` queued emails (one recipient each, spread over `--domains` recipient
domains) straight into a fresh database through the one intake's `store` in multi-row
transactions, as if a node had died with them accepted, then starts `postroom serve` over it
and reports:

- start-up: from spawning the process to `/healthz` answering 200 (migrations checked,
  leases given back; with `serve`'s workers split, an intake worker answers while the
  delivery worker starts a queue actor per domain with work beside it);
- RSS when healthy, and after `--work` seconds of delivering to the loopback sink (current
  and peak, VmRSS/VmHWM from /proc, summed over serve and its workers), with how many
  messages arrived meanwhile;
- how long one `/metrics` scrape takes (it counts the backlog per domain in the database).

The point is that the queue lives in the database: memory grows with the work in flight
(at most 200 recipients claimed per domain queue), not with the length of the queue.
"""

from __future__ import annotations

import sys
import time
from datetime import UTC, datetime
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import DOMAIN
from bench.peers import bench_parser, loopback_mail, memory_mib, postroom_process, until_healthy
from engine.domains import registry as domains
from engine.platform.runtime import Principal
from engine.sending import intake
from engine.sending.intake import Mailbox, NewEmail
from postroom import config
from postroom.startup import open_runtime
from storage.database import open_database
from storage.domains import Domain

CHUNK = 20_000  # emails per transaction


def _chunk(
    workspace_id: str, domain: Domain, start: int, count: int, domains_: int
) -> list[NewEmail]:
    return [
        NewEmail(
            workspace_id=workspace_id,
            domain_id=domain.id,
            domain_name=domain.name,
            from_email=f"news@{DOMAIN}",
            from_name=None,
            to=(Mailbox(f"reader{n}@d{n % domains_}.example"),),
            subject="Queued before the restart",
            source="api",
            text="Hello from the memory benchmark.",
        )
        for n in range(start, start + count)
    ]


async def fill(env: dict[str, str], account: dict[str, Any], count: int, domains_: int) -> float:
    """Store `count` queued emails, with the service's settings `env`; the time it took in
    seconds."""
    settings = config.load(env)
    started = time.perf_counter()
    async with open_database(settings.database_url) as db:
        rt = await open_runtime(db, settings)
        who = Principal(account["user_id"], account["email"], account["workspace_id"], "business")
        domain = await domains.create(rt, who, DOMAIN)
        now = datetime.now(UTC)
        for start in range(0, count, CHUNK):
            chunk = _chunk(who.workspace_id, domain, start, min(CHUNK, count - start), domains_)
            # The one intake's rows, stored unannounced: the service is not running yet.
            await db.transaction(
                partial(intake.store, volume_shard=None, announce=False), chunk, now
            )
    return time.perf_counter() - started


async def measure(engine: str, count: int, domains_: int, work: float) -> dict[str, Any]:
    filled: list[float] = []

    async def prepare(env: dict[str, str], account: dict[str, Any]) -> None:
        filled.append(await fill(env, account, count, domains_))

    async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, sink):
        for i in range(domains_):
            dns_server.set(f"d{i}.example", "MX", ["10 mx.dest.example."])
        async with postroom_process(
            engine, prepare, dns_servers=dns_server.nameserver, delivery_port=str(sink.port)
        ) as service:
            started = time.perf_counter()  # the process is spawned after prepare
            async with httpx.AsyncClient(base_url=service.url) as api:
                await until_healthy(api)
                startup = time.perf_counter() - started
                ready = memory_mib(service.pid)
                await trio.sleep(work)
                after = memory_mib(service.pid)
                arrived = len(sink.messages)
                # A scrape counts the whole backlog (queue depth per domain) in the database.
                started = time.perf_counter()
                scraped = await api.get("/metrics", timeout=120)
                scrape = time.perf_counter() - started
                assert scraped.status_code == 200
        nursery.cancel_scope.cancel()
    return {
        "engine": engine,
        "emails": count,
        "fill_s": filled[0],
        "startup_s": startup,
        "rss_ready_mib": ready["VmRSS"],
        "rss_work_mib": after["VmRSS"],
        "peak_mib": after["VmHWM"],
        "delivered_meanwhile": arrived,
        "work_s": work,
        "metrics_scrape_s": scrape,
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--emails", type=int, default=1_000_000)
    parser.add_argument("--domains", type=int, default=1000)
    parser.add_argument("--work", type=float, default=20.0, help="seconds of delivery")
    args = parser.parse_args()
    for engine in args.engines.split(","):
        r = trio.run(measure, engine, args.emails, args.domains, args.work)
        print(
            f"{engine:<11} {r['emails']:,} queued (written in {r['fill_s']:.0f} s): start-up"
            f" {r['startup_s']:.1f} s, RSS {r['rss_ready_mib']:.0f} MiB when healthy,"
            f" {r['rss_work_mib']:.0f} MiB after {r['work_s']:.0f} s of delivery"
            f" (peak {r['peak_mib']:.0f} MiB, {r['delivered_meanwhile']} delivered);"
            f" a /metrics scrape {r['metrics_scrape_s'] * 1000:.0f} ms",
            flush=True,
        )


if __name__ == "__main__":
    main()
