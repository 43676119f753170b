"""Contacts benchmark: `python bench/bulk.py [--engines sqlite,postgresql] [--contacts N]`.

Starts `postroom serve` in a child process over a fresh database (Business account), with
this process running the test DNS server and SMTP sink on loopback (bench/peers.py). For each
engine and run:

- import: POST a CSV of `--contacts` rows (email, name, city) to a new list's upload
  endpoint; time until the 200, in rows/s;
- send:   POST a bulk send to that list with `{{name}}` and `{{city}}` in subject and bodies;
  time until the 200 (every email committed), in emails/s. Delivery to the sink starts when
  the send has been queued; a run's emails keep being delivered during the next run, so
  `--runs` defaults to 1.

Memory is the service process's resident set from /proc: before the run, and its high-water
mark (VmHWM) after each step. Figures are the median of `--runs` runs.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import ready_to_send
from bench.peers import RECIPIENT_DOMAIN, bench_parser, loopback_mail, memory_mib, postroom_process


def _csv(rows: int, run: int) -> bytes:
    lines = ["email,name,city"]
    lines += [f"r{run}-{i}@{RECIPIENT_DOMAIN},Reader {i},City {i % 97}" for i in range(rows)]
    return ("\r\n".join(lines) + "\r\n").encode()


async def _one_run(api: httpx.AsyncClient, pid: int, run: int, rows: int) -> dict[str, Any]:
    contact_list = (await api.post("/v1/contacts/", json={"name": f"Run {run}"})).json()
    sender = (await api.get("/v1/senders/")).json()[0]["id"]
    content = _csv(rows, run)
    before = memory_mib(pid)
    started = time.perf_counter()
    uploaded = await api.post(
        f"/v1/contacts/{contact_list['id']}/upload", files={"file": ("c.csv", content)}
    )
    import_seconds = time.perf_counter() - started
    assert uploaded.status_code == 200, uploaded.text
    assert uploaded.json()["imported"] == rows, uploaded.json()
    after_import = memory_mib(pid)
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
    after_send = memory_mib(pid)
    return {
        "import_s": import_seconds,
        "send_s": send_seconds,
        "rss_before": before["VmRSS"],
        "peak_import": after_import["VmHWM"],
        "peak_send": after_send["VmHWM"],
    }


async def measure(engine: str, runs: int, rows: int) -> list[dict[str, Any]]:
    """Import and bulk-send `rows` contacts `runs` times on one engine."""
    async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, sink):
        async with (
            postroom_process(
                engine, dns_servers=dns_server.nameserver, delivery_port=str(sink.port)
            ) as service,
            httpx.AsyncClient(
                base_url=service.url,
                headers={"Authorization": f"Bearer {service.key}"},
                timeout=600,
            ) as api,
        ):
            await ready_to_send(api, dns_server)
            results = [await _one_run(api, service.pid, run, rows) for run in range(runs)]
        nursery.cancel_scope.cancel()
    return results


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
    parser = bench_parser(__doc__)
    parser.set_defaults(runs=1)
    parser.add_argument("--contacts", type=int, default=100_000)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        _report(engine, args.contacts, trio.run(measure, engine, args.runs, args.contacts))


if __name__ == "__main__":
    main()
