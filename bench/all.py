"""Every benchmark, one after the other: `python bench/all.py` (about 25 minutes; `--quick`
about 10: one run of each, no 1,000,000-queued run).

Every HTTP figure is measured with `wrk` (bench/wrk.py; installed with apt-get when missing,
as Postfix is) and comes with the CPU the service's processes spent on it. Per engine:
accept single and batch, p99 at half the maximum rate, cores used, and end to end, with
everything in ONE process (`postroom serve --workers 1`) and with delivery in ANOTHER process
than the API (bench/accept.py); the no-op Quart-Trio endpoint served the same way; Postfix
relaying the same number of messages to the same sink (bench/delivery.py, bench/postfix.py);
the SMTP relay (bench/relay.py, with Postfix under the same client); webhook fan-out
(bench/webhooks.py); and, unless `--quick`, the large queue (bench/memory.py). It writes
`bench/results.md`: each figure per engine, its ratio to the no-op or to Postfix measured in
the same run, and its target. Nothing is asserted: a figure that misses its target is
reported as it is.
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

from bench import accept, delivery, memory, postfix, webhooks, wrk
from bench.api_throughput import REPO
from bench.peers import bench_parser

HERE = REPO / "bench"
ENGINES = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}
# Targets of the performance issue that differ by engine: end to end as a multiple of
# Postfix, single accept as a share of the no-op, batch emails/s.
E2E_TARGET = {"sqlite": 1.5, "postgresql": 1.2}
ACCEPT_TARGET = {"sqlite": 0.9, "postgresql": 0.7}
BATCH_TARGET = {"sqlite": 10_000, "postgresql": 5_000}
POSTFIX_DEBCONF = ("postfix postfix/main_mailer_type select No configuration",)


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"{one:.1f} / {five:.1f}"


def _section(title: str) -> None:
    print(f"\n== {title} ({datetime.now(UTC):%H:%M:%S}, load {_load()})", flush=True)


def _relay(args: argparse.Namespace) -> str:
    """bench/relay.py's own report (it belongs to the relay's author), or why there is none."""
    script = HERE / "relay.py"
    if not script.exists():
        return "bench/relay.py is not there yet: no relay figure"
    # Postfix with the same client is measured by bench/delivery.py's Postfix run.
    command = [sys.executable, str(script), "--no-postfix", "--engines", args.engines]
    command += ["--runs", str(args.runs), "--seconds", str(args.seconds)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    if done.returncode:  # one retry: a failed run says nothing about the relay's rate
        print(done.stderr.strip().splitlines()[-1], "- running it again", flush=True)
        done = subprocess.run(command, capture_output=True, text=True, timeout=900)
    return (done.stdout + (done.stderr if done.returncode else "")).strip()


def run(args: argparse.Namespace) -> dict[str, Any]:
    engines = args.engines.split(",")
    found: dict[str, Any] = {"started": datetime.now(UTC), "load_before": _load()}
    why = wrk.missing()
    if why is not None:
        raise SystemExit(why)
    if postfix.missing() is not None:
        wrk.apt_install("postfix", *POSTFIX_DEBCONF)
    _section("no-op Quart-Trio endpoint, one process")
    found["noop"] = trio.run(accept.noop_figures, args.runs, args.seconds)
    print(f"  {found['noop']}", flush=True)
    found["cores"] = os.cpu_count() or 1
    _section(f"no-op Quart-Trio endpoint, {found['cores']} processes")
    found["noop_cores"] = trio.run(accept.noop_figures, args.runs, args.seconds, found["cores"])
    print(f"  {found['noop_cores']}", flush=True)
    # `serve` as shipped: the intake workers (half, rounded up) serve the API.
    found["intake"] = found["cores"] - found["cores"] // 2
    if found["intake"] == 1:
        found["noop_intake"] = found["noop"]
    else:
        _section(f"no-op Quart-Trio endpoint, {found['intake']} processes")
        found["noop_intake"] = trio.run(
            accept.noop_figures, args.runs, args.seconds, found["intake"]
        )
        print(f"  {found['noop_intake']}", flush=True)
    found["accept"] = {}
    for engine in engines:
        for mode in accept.MODES:
            _section(f"accept and end to end, {engine}, {mode}")
            r = trio.run(accept.mode_figures, engine, mode, args.runs, args.seconds)
            found["accept"][(engine, mode)] = r
            print(f"  {accept.line(r)}", flush=True)
    _section("Postfix relaying the same messages")
    count = max(r["e2e_messages"] for r in found["accept"].values())
    found["postfix"] = trio.run(delivery.postfix_figures, count, args.runs)
    found["postfix_missing"] = postfix.missing()
    print(f"  {found['postfix']}", flush=True)
    _section("SMTP relay (bench/relay.py)")
    found["relay"] = _relay(args)
    print(found["relay"], flush=True)
    found["relay_rates"] = {
        match[1]: float(match[2])
        for match in re.finditer(r"^(\w+)\s+relay accept\s+(\d+) msg/s", found["relay"], re.M)
    }
    found["webhooks"] = {}
    hooks = argparse.Namespace(runs=args.runs, emails=200 if args.quick else 500, webhooks=5)
    for engine in engines:
        _section(f"webhook fan-out, {engine}")
        found["webhooks"][engine] = trio.run(webhooks.fan_out, engine, hooks)
        print(f"  {found['webhooks'][engine]}", flush=True)
    found["memory"] = {}
    found["queued"] = 0 if args.quick else args.queued
    for engine in engines if found["queued"] else ():
        _section(f"{args.queued:,} queued emails, {engine}")
        found["memory"][engine] = trio.run(memory.measure, engine, args.queued, 1000, 20.0)
        print(f"  {found['memory'][engine]}", flush=True)
    found["load_after"] = _load()
    found["minutes"] = (datetime.now(UTC) - found["started"]).total_seconds() / 60
    return found


Row = tuple[str, list[float], str, list[str], str]  # figure, values, reference, ratios, target


def _share(value: float, reference: float) -> str:
    return f"{value / reference:.2f}x" if reference else ""


def _rows(f: dict[str, Any], engines: list[str]) -> list[Row]:
    """Each figure per engine, what it is compared with, the ratio per engine and the target."""
    noops = {"one": f["noop"]["rate"], "split": f["noop_intake"]["rate"]}
    noops["cores"] = f["noop_cores"]["rate"]
    theirs = f["postfix"]
    e2e_postfix = theirs["e2e_per_s"] if theirs else 0.0
    relay_postfix = theirs["relay_client_accept"] if theirs else 0.0

    def each(mode: str, key: str) -> list[float]:
        return [float(f["accept"][(e, mode)][key]) for e in engines]

    def to(values: list[float], reference: float) -> list[str]:
        return [_share(v, reference) for v in values]

    names = {
        "one": "everything in one process",
        "split": f"serve's default, {f['intake']} intake + {f['cores'] // 2} delivery workers",
        "cores": f"{f['cores']} workers each accepting and delivering",
    }
    rows: list[Row] = [
        (
            f"no-op Quart-Trio accept, {label} (req/s)",
            [noop["rate"] for _ in engines],
            f"{noop['cpu_ms']:.2f} ms CPU/request, {noop['cores']:.2f} cores",
            [],
            "",
        )
        for label, noop in (
            ("one process", f["noop"]),
            (f"{f['cores']} processes", f["noop_cores"]),
        )
    ]
    accept_target = " / ".join(f"{ACCEPT_TARGET[e]}x" for e in engines) + " of the no-op"
    for mode in accept.MODES:
        rows += [
            (
                f"API accept, single, {names[mode]} (req/s)",
                each(mode, "accept_rate"),
                f"no-op {noops[mode]:.0f}",
                to(each(mode, "accept_rate"), noops[mode]),
                accept_target,
            ),
            (f"  CPU per accepted email, {mode} (ms)", each(mode, "accept_cpu_ms"), "", [], ""),
            (f"  cores used accepting, {mode}", each(mode, "accept_cores"), "", [], ""),
            (f"  accept p99 flat out, {mode} (ms)", each(mode, "accept_p99_ms"), "", [], ""),
            (
                f"  p99 at half the max rate, {mode} (ms)",
                each(mode, "half_rate_p99_ms"),
                "",
                [],
                "< 50 ms",
            ),
            (
                f"API accept, batch of 100, {mode} (emails/s)",
                each(mode, "batch_emails_per_s"),
                "",
                [],
                " / ".join(f">= {BATCH_TARGET[e]:,}" for e in engines),
            ),
            (f"  CPU per batched email, {mode} (ms)", each(mode, "batch_cpu_ms"), "", [], ""),
            (
                f"end to end, {names[mode]} (emails/s)",
                each(mode, "e2e_per_s"),
                f"Postfix {e2e_postfix:.0f}" if theirs else "Postfix not run",
                to(each(mode, "e2e_per_s"), e2e_postfix),
                " / ".join(f">= {E2E_TARGET[e]}x Postfix" for e in engines),
            ),
        ]
    relay = [f["relay_rates"].get(e, 0.0) for e in engines]
    hooks = [float(f["webhooks"][e]["rate"]) for e in engines]
    rows += [
        (
            f"SMTP relay accept, {f['cores']} workers (msg/s)",
            relay,
            f"Postfix {relay_postfix:.0f}, same client" if theirs else "",
            to(relay, relay_postfix),
            ">= 1.0x Postfix",
        ),
        ("webhook fan-out (signed deliveries/s)", hooks, "", [], ">= 2,000"),
        (
            "  CPU per webhook delivery, emails' delivery included (ms)",
            [float(f["webhooks"][e]["cpu_ms"]) for e in engines],
            "",
            [],
            "",
        ),
    ]
    if f["memory"]:
        queued = f"{f['queued']:,} queued"

        def kept(key: str) -> list[float]:
            return [float(f["memory"][e][key]) for e in engines]

        rows += [
            (f"{queued}: start-up (s)", kept("startup_s"), "", [], "< 5 s"),
            (f"{queued}: RSS healthy, all processes (MiB)", kept("rss_ready_mib"), "", [], ""),
            (f"{queued}: one /metrics scrape (s)", kept("metrics_scrape_s"), "", [], ""),
            (
                f"{queued}: peak RSS delivering, all processes (MiB)",
                kept("peak_mib"),
                "",
                [],
                "< 1024",
            ),
        ]
    return rows


def _cell(value: float) -> str:
    return f"{value:,.2f}" if value < 10 else f"{value:,.0f}"


def write_markdown(f: dict[str, Any], engines: list[str], path: Path, quick: bool) -> None:
    names = [ENGINES.get(e, e) for e in engines]
    command = "python bench/all.py" + (" --quick" if quick else "")
    how = "one run of each figure" if quick else "medians of several runs"
    lines = [
        "# Benchmark results",
        "",
        f"`{command}`, {f['started']:%Y-%m-%d %H:%M} UTC, {f['minutes']:.0f} minutes;"
        f" {os.cpu_count()} cores, Python {platform.python_version()}; load average (1/5 min)"
        f" {f['load_before']} before, {f['load_after']} after; {how}.",
        "",
        "| figure | " + " | ".join(names) + " | compared with | ratio | target |",
        "|---|" + "---:|" * len(names) + "---|---|---|",
    ]
    for figure, values, reference, ratios, target in _rows(f, engines):
        cells = " | ".join(_cell(v) for v in values)
        ratio = " / ".join(ratios)
        lines.append(f"| {figure} | {cells} | {reference} | {ratio} | {target} |")
    theirs = f["postfix"]
    lines += ["", "## How it was measured", ""]
    lines += [
        "- HTTP load: `wrk` (one thread, C), 50 keep-alive connections for single accepts",
        f"  ({accept.CONNECTIONS}), {accept.BATCH_CONNECTIONS} for batches of"
        f" {accept.BATCH}; a Lua script gives every request a unique recipient; the half-rate",
        "  run paces requests on wrk's clock at half the flat-out rate.",
        "- **one**: `postroom serve --workers 1`, the API and delivery in ONE process, accepting",
        "  while it delivers. **split**: `postroom serve` as shipped, its"
        f" {f['cores']} workers split",
        f"  into {f['intake']} intake (API) and {f['cores'] // 2} delivery workers."
        " **cores**: `postroom serve",
        f"  --delivery-workers 0`, {f['cores']} workers each accepting and delivering. one is",
        "  compared with the no-op in one process, split with the no-op in as many processes",
        "  as intake workers, cores with the no-op in as many processes as workers.",
        "- CPU per email and cores used: user+system CPU of all the service's processes (read",
        "  from /proc) over the run, divided by the emails accepted and by the run's seconds.",
        "- End to end: emails/s from the start of the flat-out accept run to the sink's 250 for",
        "  the last of them. The sink is the project's Python test sink",
        "  (tests/harness/smtp_sink.py), for Postroom and Postfix alike; server, load",
        "  generator, DNS server and sink share this machine's cores.",
        "",
        "## Postfix",
        "",
    ]
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
    lines += ["## Runs", "", "```"]
    lines += [accept.line(r) for r in f["accept"].values()]
    lines += [f"webhooks {e}: {f['webhooks'][e]}" for e in engines]
    lines += ["```", ""]
    path.write_text("\n".join(lines))


def _postfix_version() -> str:
    done = subprocess.run(["postconf", "-d", "mail_version"], capture_output=True, text=True)
    return done.stdout.split("=")[-1].strip()


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--queued", type=int, default=1_000_000, help="emails for the memory run")
    parser.add_argument(
        "--quick", action="store_true", help="one run of 4 s each, no large-queue run"
    )
    args = parser.parse_args()
    if args.quick:
        args.runs, args.seconds = 1, 4.0
    started = time.perf_counter()
    found = run(args)
    engines = args.engines.split(",")
    write_markdown(found, engines, HERE / "results.md", args.quick)
    print(f"results in {HERE / 'results.md'} ({(time.perf_counter() - started) / 60:.0f} min)")


if __name__ == "__main__":
    main()
