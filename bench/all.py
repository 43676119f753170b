"""Every benchmark, one after the other: `python bench/all.py` (about 15-25 minutes).

Runs the no-op ceiling (bench/ceiling.py), sending and end-to-end delivery on each engine
with Postfix relaying the same number of messages (bench/delivery.py, bench/postfix.py), the
SMTP relay benchmark (bench/relay.py, when present), webhook fan-out (bench/webhooks.py) and
the large queue (bench/memory.py), then writes `bench/results.md` (a Markdown table of the
figures, their reference, ratio and target) and `bench/results.png` (each figure as a share
of its target; needs the `bench` extra: `pip install -e ".[bench]"`). Nothing is asserted:
a figure that misses its target is reported as it is.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import ceiling, delivery, memory, postfix, webhooks
from bench.api_throughput import REPO
from bench.peers import bench_parser

HERE = REPO / "bench"
ENGINES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} / {five:.1f}"


def _section(title: str) -> None:
    print(f"\n== {title} ({datetime.now(UTC):%H:%M:%S}, load {_load()})", flush=True)


def _relay() -> str:
    """bench/relay.py's own report (it belongs to the relay's author), or why there is none."""
    script = HERE / "relay.py"
    if not script.exists():
        return "bench/relay.py is not there yet: no relay figure"
    # Postfix with the same client is measured by bench/delivery.py's Postfix run.
    command = [sys.executable, str(script), "--no-postfix"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode:  # one retry: a failed run says nothing about the relay's rate
        print(done.stderr.strip().splitlines()[-1], "- running it again", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    return (done.stdout + (done.stderr if done.returncode else "")).strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    engines = args.engines.split(",")
    found: dict[str, Any] = {"started": datetime.now(UTC), "load_before": _load()}
    _section("no-op Quart-Trio ceiling")
    found["ceiling"] = ceiling.measure(args.runs, args.seconds)
    print(f"  {found['ceiling']['rate']:.0f} req/s", flush=True)
    found["send"] = {}
    for engine in engines:
        _section(f"sending and delivery, {engine}")
        found["send"][engine] = trio.run(delivery.postroom_figures, engine, args.runs, args.seconds)
        print(f"  {found['send'][engine]}", flush=True)
    _section("Postfix relaying the same messages")
    count = max(r["e2e_messages"] for r in found["send"].values())
    found["postfix"] = trio.run(delivery.postfix_figures, count, args.runs)
    found["postfix_missing"] = postfix.missing()
    print(f"  {found['postfix']}", flush=True)
    _section("SMTP relay (bench/relay.py)")
    found["relay"] = _relay()
    print(found["relay"], flush=True)
    found["relay_rates"] = {
        match[1]: float(match[2])
        for match in re.finditer(r"^(\w+)\s+relay accept\s+(\d+) msg/s", found["relay"], re.M)
    }
    found["webhooks"] = {}
    hooks = argparse.Namespace(runs=args.runs, emails=500, webhooks=5)
    for engine in engines:
        _section(f"webhook fan-out, {engine}")
        found["webhooks"][engine] = trio.run(webhooks.fan_out, engine, hooks)
        print(f"  {found['webhooks'][engine]}", flush=True)
    found["memory"] = {}
    found["queued"] = args.queued
    for engine in engines:
        _section(f"{args.queued:,} queued emails, {engine}")
        found["memory"][engine] = trio.run(memory.measure, engine, args.queued, 1000, 20.0)
        print(f"  {found['memory'][engine]}", flush=True)
    found["load_after"] = _load()
    found["minutes"] = (datetime.now(UTC) - found["started"]).total_seconds() / 60
    return found


def _rows(f: dict[str, Any], engines: list[str]) -> list[tuple[str, list[float], str, str, float]]:
    """(figure, value per engine, reference, target text, target value as a share of 1)."""
    ceiling_rate = f["ceiling"]["rate"]
    queued = f"{f['queued']:,}"
    theirs = f["postfix"]

    def each(table: str, key: str) -> list[float]:
        return [float(f[table][e][key]) for e in engines]

    rows = [
        (
            "API accept, single (req/s)",
            each("send", "accept_rate"),
            f"no-op Quart-Trio {ceiling_rate:.0f}",
            ">= 90% of the no-op",
            0.9 * ceiling_rate,
        ),
        ("accept p50 (ms)", each("send", "accept_p50_ms"), "", "", 0.0),
        ("accept p99 (ms)", each("send", "accept_p99_ms"), "", "", 0.0),
        ("p99 at half the max rate (ms)", each("send", "half_rate_p99_ms"), "", "< 50 ms", 50.0),
        ("API accept, batch (emails/s)", each("send", "batch_emails_per_s"), "", ">= 10,000", 1e4),
        (
            "end-to-end delivery (emails/s)",
            each("send", "e2e_per_s"),
            f"Postfix {theirs['e2e_per_s']:.0f}" if theirs else "Postfix not run",
            ">= 1.5x Postfix",
            1.5 * theirs["e2e_per_s"] if theirs else 0.0,
        ),
        (
            "SMTP relay accept (msg/s)",
            [f["relay_rates"].get(e, 0.0) for e in engines],
            f"Postfix {theirs['relay_client_accept']:.0f}, same client" if theirs else "",
            ">= Postfix",
            theirs["relay_client_accept"] if theirs else 0.0,
        ),
        (
            "webhook fan-out (deliveries/s)",
            each("webhooks", "rate"),
            "",
            ">= 2,000",
            2000.0,
        ),
        (f"{queued} queued: start-up (s)", each("memory", "startup_s"), "", "< 5 s", 5.0),
        (f"{queued} queued: RSS healthy (MiB)", each("memory", "rss_ready_mib"), "", "", 0.0),
        (
            f"{queued} queued: one /metrics scrape (s)",
            each("memory", "metrics_scrape_s"),
            "",
            "",
            0.0,
        ),
        (
            f"{queued} queued: peak RSS delivering (MiB)",
            each("memory", "peak_mib"),
            "",
            "< 1024",
            1024.0,
        ),
    ]
    return rows


def _ratio(value: float, target: float, lower_is_better: bool) -> str:
    if not target:
        return ""
    share = target / value if lower_is_better and value else value / target
    return f"{share:.2f}"


def write_markdown(f: dict[str, Any], engines: list[str], path: Path) -> None:
    names = [ENGINES.get(e, e) for e in engines]
    lines = [
        "# Benchmark results",
        "",
        f"`python bench/all.py`, {f['started']:%Y-%m-%d %H:%M} UTC, {f['minutes']:.0f} minutes;"
        f" {os.cpu_count()} cores, Python {platform.python_version()}; load average (1/5 min)"
        f" {f['load_before']} before, {f['load_after']} after. Medians of several runs.",
        "",
        "| figure | " + " | ".join(names) + " | reference | target | share of target |",
        "|---|" + "---:|" * len(names) + "---|---|---|",
    ]
    for figure, values, reference, target_text, target in _rows(f, engines):
        lower = "(ms)" in figure or "(s)" in figure or "MiB" in figure
        shares = " / ".join(_ratio(v, target, lower) for v in values) if target else ""
        cells = " | ".join(f"{v:,.1f}" if v < 100 else f"{v:,.0f}" for v in values)
        lines.append(f"| {figure} | {cells} | {reference} | {target_text} | {shares} |")
    theirs = f["postfix"]
    lines += ["", "## Postfix", ""]
    if theirs:
        lines.append(
            f"A private Postfix {_postfix_version()} relaying {theirs['messages']} messages of"
            f" {postfix.MESSAGE_BYTES} bytes to the same kind of sink, injected with"
            f" `smtp-source -s 50`: SMTP accept {theirs['accept_rate']:.0f} msg/s, end to end"
            f" {theirs['e2e_per_s']:.0f} msg/s. With bench/relay.py's smtplib client (4"
            f" processes x 8 connections, one message per connection, no AUTH) it accepts"
            f" {theirs['relay_client_accept']:.0f} msg/s."
        )
    else:
        lines.append(f"Not run: {f['postfix_missing']}.")
    lines += ["", "## SMTP relay (bench/relay.py)", "", "```", f["relay"], "```", ""]
    lines += [
        "## Setup",
        "",
        "- Server, load client, DNS server and SMTP sink share this machine's cores; the sink",
        "  is the project's Python test sink (tests/harness/smtp_sink.py), for Postroom and",
        "  Postfix alike.",
        "- API load: bench/load.py, 50 keep-alive HTTP/1.1 connections, one recipient per",
        "  email; batch: 100 emails per request.",
        f"- {f['queued']:,} queued: written through storage.emails.insert, 1,000 recipient domains; RSS",
        "  from /proc after /healthz answers and after 20 s of delivery.",
        "",
    ]
    path.write_text("\n".join(lines))


def _postfix_version() -> str:
    done = subprocess.run(["postconf", "-d", "mail_version"], capture_output=True, text=True)
    return done.stdout.split("=")[-1].strip()


def write_chart(f: dict[str, Any], engines: list[str], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return 'matplotlib is not installed (pip install -e ".[bench]"): no chart'
    rows = [row for row in _rows(f, engines) if row[4]]
    fig, ax = plt.subplots(figsize=(10, 5))
    width = 0.8 / len(engines)
    for i, engine in enumerate(engines):
        shares = []
        for figure, values, _, _, target in rows:
            lower = "(ms)" in figure or "(s)" in figure or "MiB" in figure
            value = values[i]
            shares.append((target / value if value else 0.0) if lower else value / target)
        ax.bar([n + i * width for n in range(len(rows))], shares, width, label=ENGINES[engine])
    ax.axhline(1.0, color="black", linewidth=1, linestyle="--")
    ax.set_xticks([n + width * (len(engines) - 1) / 2 for n in range(len(rows))])
    ax.set_xticklabels([row[0] for row in rows], rotation=25, ha="right", fontsize=8)
    ax.set_ylabel("share of target (1 = target met)")
    ax.set_title("Postroom benchmarks against their targets")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    return f"chart written to {path}"


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--queued", type=int, default=1_000_000, help="emails for the memory run")
    args = parser.parse_args()
    started = time.perf_counter()
    found = run(args)
    engines = args.engines.split(",")
    write_markdown(found, engines, HERE / "results.md")
    print(write_chart(found, engines, HERE / "results.png"))
    print(f"results in {HERE / 'results.md'} ({(time.perf_counter() - started) / 60:.0f} min)")


if __name__ == "__main__":
    main()
