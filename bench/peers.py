"""Postroom in a child process for the benchmarks, with the test peers it talks to.

`loopback_mail()` runs the project's test DNS server and SMTP sink in this process, with
`dest.example` routed to the sink; `c_sink_mail()` the same with Postfix's C smtp-sink.
`postroom_process(engine, ...)` creates a database on the engine, a Business account with
the CLI, starts `postroom serve` in a child process (so server and load client each get a
core) and yields its URL, API key and pid; it stops the process with SIGTERM, as systemd
would.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import trio

from bench.api_throughput import CREATE_ACCOUNT, REPO, _database, _free_port
from bench.postfix import CSink
from bench.wrk import process_tree
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

RECIPIENT_DOMAIN = "dest.example"


@dataclass(frozen=True, slots=True)
class Running:
    url: str
    key: str
    pid: int
    database_url: str


def bench_parser(doc: str | None) -> argparse.ArgumentParser:
    """The options every benchmark takes: --engines, --runs, --seconds (per load run)."""
    parser = argparse.ArgumentParser(
        description=doc, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    return parser


def memory_mib(pid: int) -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident memory of a process and its descendants
    (`postroom serve`'s workers), summed, in MiB: the peaks of different processes need not
    coincide, so their sum is an upper bound."""
    found = {"VmRSS": 0.0, "VmHWM": 0.0}
    for member in process_tree(pid):
        try:
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        for line in status.splitlines():
            key, _, value = line.partition(":")
            if key in found:
                found[key] += int(value.split()[0]) / 1024
    return found


@asynccontextmanager
async def loopback_mail(nursery: trio.Nursery) -> AsyncIterator[tuple[DnsServer, SmtpSink]]:
    """The DNS server and SMTP sink, with RECIPIENT_DOMAIN's MX pointing at the sink."""
    dns_server, sink = DnsServer(), SmtpSink()
    await nursery.start(dns_server.run)
    await nursery.start(sink.run)
    dns_server.set(RECIPIENT_DOMAIN, "MX", [f"10 mx.{RECIPIENT_DOMAIN}."])
    dns_server.set(f"mx.{RECIPIENT_DOMAIN}", "A", ["127.0.0.1"])
    yield dns_server, sink


@asynccontextmanager
async def postroom_process(
    engine: str,
    prepare: Callable[[dict[str, str], dict[str, Any]], Awaitable[None]] | None = None,
    *,
    serve: Sequence[str] = (),
    **settings: str,
) -> AsyncIterator[Running]:
    """`postroom serve` over a fresh database on `engine`; `settings` are POSTROOM_* values
    by lower-case name (e.g. dns_servers="127.0.0.1:5353"). `prepare(env, account)` runs
    after the account exists (the JSON of `accounts create`) and before the service starts,
    with the environment the service gets (its database and master key file). `serve`: more
    arguments for `postroom serve` (e.g. its workers)."""
    with tempfile.TemporaryDirectory() as tmp, _database(engine, Path(tmp)) as db_url:
        port = _free_port()
        env = {
            "POSTROOM_DATABASE_URL": db_url,
            "POSTROOM_API_LISTEN": f"127.0.0.1:{port}",
            "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{_free_port()}",
            "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{_free_port()}",
            "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",  # the sink and peers are on loopback
            # The master key file, wherever the database is (PostgreSQL's is not a file).
            "POSTROOM_SECRET_KEY_FILE": str(Path(tmp) / "secret.key"),
            "PYTHONPATH": str(REPO),
            "PATH": "/usr/bin:/bin",
        }
        env.update({f"POSTROOM_{name.upper()}": value for name, value in settings.items()})
        cli = [sys.executable, "-m", "postroom"]
        created = await trio.run_process(
            [*cli, *CREATE_ACCOUNT], env=env, cwd=tmp, capture_stdout=True
        )
        account = json.loads(created.stdout)
        key = account["api_key"]
        if prepare is not None:
            await prepare(env, account)
        server = await trio.lowlevel.open_process(
            [*cli, "serve", *serve], env=env, cwd=tmp, stderr=subprocess.DEVNULL
        )
        try:
            yield Running(f"http://127.0.0.1:{port}", key, server.pid, db_url)
        finally:
            server.terminate()
            with trio.move_on_after(60) as waited:
                await server.wait()
            if waited.cancelled_caught:
                server.kill()
                await server.wait()


@asynccontextmanager
async def c_sink_mail(nursery: trio.Nursery) -> AsyncIterator[tuple[DnsServer, CSink]]:
    """As `loopback_mail`, with Postfix's C smtp-sink as the MX instead of the Python sink."""
    dns_server, sink = DnsServer(), CSink()
    await nursery.start(dns_server.run)
    await nursery.start(sink.run)
    dns_server.set(RECIPIENT_DOMAIN, "MX", [f"10 mx.{RECIPIENT_DOMAIN}."])
    dns_server.set(f"mx.{RECIPIENT_DOMAIN}", "A", ["127.0.0.1"])
    yield dns_server, sink


STARTUP = 300  # seconds a service may take to answer /healthz (a loaded machine starts slowly)


async def until_healthy(api: httpx.AsyncClient) -> None:
    """Wait until the service `api` talks to answers /healthz with 200."""
    with trio.fail_after(STARTUP):
        while True:
            try:
                if (await api.get("/healthz")).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            await trio.sleep(0.02)


async def verified_domain(api: httpx.AsyncClient, dns_server: DnsServer, name: str) -> str:
    """The id of domain `name`, added, its DKIM record published on `dns_server`, verified."""
    domain = (await api.post("/v1/domains/", json={"name": name})).json()
    dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim["host"], "TXT", [dkim["value"]])
    verified = (await api.post(f"/v1/domains/{domain['id']}/verify")).json()
    assert verified["status"] == "verified", verified
    return str(domain["id"])
