"""Contacts benchmark: `python bench/bulk.py [--engines sqlite,postgresql] [--contacts N]`.

Starts `postroom serve` in a child process over a fresh database (Business account), with
this process running the test DNS server and SMTP sink on loopback. For each engine and run:

- import: POST a CSV of `--contacts` rows (email, name, city) to a new list's upload
  endpoint; time until the 200, in rows/s;
- send:   POST a bulk send to that list with `{{name}}` and `{{city}}` in subject and bodies;
  time until the 200 (every email committed), in emails/s. Delivery to the sink runs
  meanwhile, as it would in production (the emails of a run keep being delivered later).

Memory is the service process's resident set from /proc: before the run, and its high-water
mark (VmHWM) after each step. Figures are the median of `--runs` runs.
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
from bench.delivery import ready_to_send
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

RECIPIENTS = "dest.example"


def _memory_mib(pid: int) -> dict[str, float]:
    """Current (VmRSS) and peak (VmHWM) resident memory of a process, in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def _csv(rows: int, run: int) -> bytes:
    lines = ["email,name,city"]
    lines += [f"r{run}-{i}@{RECIPIENTS},Reader {i},City {i % 97}" for i in range(rows)]
    return ("\r\n".join(lines) + "\r\n").encode()


async def _one_run(api: httpx.AsyncClient, pid: int, run: int, rows: int) -> dict[str, Any]:
    contact_list = (await api.post("/v1/contacts/", json={"name": f"Run {run}"})).json()
    sender = (await api.get("/v1/senders/")).json()[0]["id"]
    content = _csv(rows, run)
    before = _memory_mib(pid)
    started = time.perf_counter()
    uploaded = await api.post(
        f"/v1/contacts/{contact_list['id']}/upload", files={"file": ("c.csv", content)}
    )
    import_seconds = time.perf_counter() - started
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["imported"] == rows, uploaded.json()
    after_import = _memory_mib(pid)
    body = {
        "contact_list_id": contact_list["id"],
        "sender_address_id": sender,
        "subject": "News for {{name}} in {{city}}",
        "html": "<p>Dear {{name}},</p><p>What is new in {{city}} this week.</p>",
        "text": "Dear {{name}},\n\nWhat is new in {{city}} this week.",
    }
    started = time.perf_counter()
    sent = await api.post(f"/v1/contacts/{contact_list['id']}/send", json=body)
    send_seconds = time.perf_counter() - started
    assert sent.status_code == 200, sent.text
    assert sent.json()["queued"] == rows, sent.json()
    after_send = _memory_mib(pid)
    return {
        "import_s": import_seconds,
        "send_s": send_seconds,
        "rss_before": before["VmRSS"],
        "peak_import": after_import["VmHWM"],
        "peak_send": after_send["VmHWM"],
    }


async def _run_engine(engine: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        dns_server, sink = DnsServer(), SmtpSink()
        async with trio.open_nursery() as nursery:
            for peer in (dns_server, sink):
                await nursery.start(peer.run)
            dns_server.set(RECIPIENTS, "MX", [f"10 mx.{RECIPIENTS}."])
            dns_server.set(f"mx.{RECIPIENTS}", "A", ["127.0.0.1"])
            with _database(engine, Path(tmp)) as db_url:
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
                try:
                    async with httpx.AsyncClient(
                        base_url=f"http://127.0.0.1:{port}",
                        headers={"Authorization": f"Bearer {key}"},
                        timeout=600,
                    ) as api:
                        await ready_to_send(api, dns_server)
                        runs = [
                            await _one_run(api, server.pid, run, args.contacts)
                            for run in range(args.runs)
                        ]
                finally:
                    server.terminate()
                    await server.wait()
            _report(engine, args.contacts, runs)
            nursery.cancel_scope.cancel()


def _report(engine: str, rows: int, runs: list[dict[str, Any]]) -> None:
    def median(key: str) -> float:
        return float(statistics.median(r[key] for r in runs))

    each = ", ".join(f"{r['import_s']:.1f}/{r['send_s']:.1f} s" for r in runs)
    print(
        f"{engine:<11} import {rows} rows: {median('import_s'):6.2f} s"
        f" ({rows / median('import_s'):7.0f} rows/s);"
        f" bulk send {rows}: {median('send_s'):6.2f} s ({rows / median('send_s'):7.0f} emails/s)"
        f"\n{'':<11} RSS before {median('rss_before'):.0f} MiB,"
        f" peak after import {median('peak_import'):.0f} MiB,"
        f" peak after send {median('peak_send'):.0f} MiB"
        f"  (runs, import/send: {each})",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--contacts", type=int, default=100_000)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        trio.run(_run_engine, engine, args)


if __name__ == "__main__":
    main()
