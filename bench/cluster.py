"""Several nodes on one PostgreSQL database: throughput per node count, and what a crash costs.

For 1, 2 and 3 `postroom serve` processes on one fresh database (all on this machine's cores,
the DNS server and SMTP sink in this process):
- throughput: EMAILS emails accepted through the nodes in turn, then timed from the first
  send to the last arrival at the sink (end to end, emails/s);
- chaos (2 and 3 nodes): a second batch to a sink answering each message after 20 ms, one node
  killed with SIGKILL once mail is arriving; lost (accepted, never arrived), duplicates
  (arrived more than once), the bound on duplicates (recipients the node held at the kill),
  and takeover (seconds from the kill to the first arrival of mail the dead node held).

    .venv/bin/python -m bench.cluster [--emails 2000] [--nodes 1,2,3]

It writes bench/cluster-results.md.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

import trio

from bench.api_throughput import _database
from bench.peers import loopback_mail
from tests.harness.cluster import (
    Cluster,
    arrivals,
    prepare_account,
    running_cluster,
    send_emails,
    until_arrived,
)
from tests.harness.smtp_sink import SmtpSink

# Mail for several domains, so several nodes can deliver at once (each domain's connections
# are limited across the cluster).
DOMAINS = [f"d{i}.example" for i in range(12)]
RESULTS = Path(__file__).resolve().parent / "cluster-results.md"


async def _one(nodes: int, emails: int) -> dict[str, float]:
    figures: dict[str, float] = {"nodes": nodes}
    with tempfile.TemporaryDirectory() as tmp, _database("postgresql", Path(tmp)) as url:
        async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns, sink):
            with running_cluster(
                nodes, url, Path(tmp), dns_nameserver=dns.nameserver, delivery_port=sink.port
            ) as cluster:
                key = await prepare_account(cluster, dns, DOMAINS, None)
                started = trio.current_time()
                accepted = await send_emails(cluster, key, emails, DOMAINS)
                figures["accept_per_s"] = emails / (trio.current_time() - started)
                await until_arrived(sink, set(accepted), 600)
                last = max(at for _, at in arrivals(sink))
                figures["end_to_end_per_s"] = emails / (last - started)
                if nodes > 1:
                    figures.update(await _chaos(cluster, key, sink, emails))
            nursery.cancel_scope.cancel()
    return figures


async def _chaos(cluster: Cluster, key: str, sink: SmtpSink, emails: int) -> dict[str, float]:
    sink.messages.clear()
    sink.data_delay = 0.02
    accepted = await send_emails(cluster, key, emails, DOMAINS, first=emails)
    await sink.wait_for_messages(20, timeout=120)
    by_pid = await trio.to_thread.run_sync(cluster.held_by_process)
    victim = max(cluster.nodes, key=lambda node: len(by_pid.get(node.pid, ())))  # the busiest
    held = by_pid.get(victim.pid, set())
    await trio.to_thread.run_sync(victim.kill)
    killed_at = trio.current_time()
    await until_arrived(sink, set(accepted), 600)
    arrived = arrivals(sink)
    counts = Counter(mid for mid, _ in arrived)
    held_emails = {email_id for email_id, _ in held}
    taken = [at for mid, at in arrived if accepted.get(mid) in held_emails and at > killed_at]
    return {
        "lost": len(set(accepted) - set(counts)),
        "duplicates": sum(n - 1 for n in counts.values()),
        "duplicate_bound": len(held),
        "takeover_s": (min(taken) - killed_at) if taken else float("nan"),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--emails", type=int, default=2000)
    parser.add_argument("--nodes", default="1,2,3")
    args = parser.parse_args()
    started = time.monotonic()
    load_before = os.getloadavg()[:2]
    rows = [trio.run(_one, int(n), args.emails) for n in args.nodes.split(",")]
    lines = [
        "| nodes | accept/s | end to end/s | lost | duplicates (bound) | takeover s |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        chaos = (
            f"{r['lost']:.0f} | {r['duplicates']:.0f} ({r['duplicate_bound']:.0f}) |"
            f" {r['takeover_s']:.1f}"
            if "lost" in r
            else "- | - | -"
        )
        lines.append(
            f"| {r['nodes']:.0f} | {r['accept_per_s']:.0f} | {r['end_to_end_per_s']:.0f} |"
            f" {chaos} |"
        )
    table = "\n".join(lines)
    print(table)
    print(f"({time.monotonic() - started:.0f} s)")
    when = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    RESULTS.write_text(
        "# Several nodes on one PostgreSQL database\n\n"
        f"`python -m bench.cluster --emails {args.emails} --nodes {args.nodes}`, {when},"
        f" {time.monotonic() - started:.0f} s; {os.cpu_count()} cores shared by the nodes, the"
        " load generator, the DNS server and the sink; load average (1/5 min) before"
        f" {load_before[0]:.1f} / {load_before[1]:.1f}.\n\n"
        f"{table}\n\n"
        "accept/s: the emails accepted through the nodes in turn (12 requests at a time);"
        " end to end/s: from the first send to the last arrival. The chaos columns come from a"
        " second batch to a sink answering each message after 20 ms, with the busiest node"
        " killed (SIGKILL) once mail arrives: lost = accepted and never arrived; duplicates ="
        " arrivals beyond the first, bounded by the recipients the killed node held at the kill;"
        " takeover = seconds from the kill to the first arrival of mail the dead node held.\n"
    )


if __name__ == "__main__":
    main()
