"""Does a second MX site in use lower the delivery rate to the first? (issue 32, item 7):
`python bench/sites.py [--engines sqlite,postgresql] [--runs 3] [--count 3000]
[--variants fast,slow,stalled] [--profile DIR] [--serve "--workers 3 --delivery-workers 2"]`.

Recipient domain A (dest.example) has one MX, Postfix's C smtp-sink on 127.0.0.1 (sink 1);
domain B (second.example) has a second sink on 127.0.0.2 at the same port (the service
connects to every MX on POSTROOM_DELIVERY_PORT). `postroom serve` as shipped runs over a fresh
database on each engine; every run's emails are accepted beforehand in batches, each phase
with its own `send_at`, so each delivery window is timed alone. A run has two phases (every
other run takes the second first):

- alone: N emails to A; the rate at sink 1 from when they fall due to the last arrival;
- with B: N to A and N to B falling due together; the rate at sink 1 again, over the time
  A's mail takes, and what B got meanwhile.

Per run it prints both rates, their ratio (with B / alone), A+B over A alone, and the CPU the
service spent per email delivered in each window (every process, from /proc); then medians
and a one-line verdict per variant. B's sink is, per `--variants`: `fast`, a second C
smtp-sink; `slow`, the project's Python test sink answering each message's data 200 ms late;
`stalled`, the same 30 s late, so B's connections wait out A's whole window. Once A's mail
is in, a slow sink answers at once again and B's mail drains before the next phase. With
`--profile DIR`, py-spy (`--gil`) records every process of the service during each phase,
into DIR/<engine>-<variant>-run<N>-<alone|with-b>-<pid>.txt (collapsed stacks).
Only 127.0.0.1 and 127.0.0.2 are ever connected to.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import (
    Sink,
    received,
    schedule,
    sending_service,
    start_spies,
    stop_spies,
)
from bench.peers import bench_parser, c_sink_mail
from bench.postfix import CSink, tree_cpu_seconds
from bench.stats import median
from tests.harness.smtp_sink import SmtpSink

SECOND_DOMAIN = "second.example"
SECOND_SITE = "127.0.0.2"
# Seconds B's sink waits before answering each message's data; None: the C sink.
VARIANTS: dict[str, float | None] = {"fast": None, "slow": 0.2, "stalled": 30.0}
ALONE, WITH_B = "alone", "with-b"  # a run's phases
NOT_LOWERED = 0.9  # with B / alone at or above this counts as not lowered (run-to-run noise)


class SiteSink(SmtpSink):
    """The project's Python test sink on a given address and port (SmtpSink itself takes a
    free port on 127.0.0.1), answering each message's data `data_delay` seconds late."""

    def __init__(self, host: str, port: int, data_delay: float) -> None:
        super().__init__()
        self._site = host
        self._port = port
        self.data_delay = data_delay

    @property
    def host(self) -> str:
        return self._site

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(partial(trio.serve_tcp, self._handle, self.port, host=self._site))
            task_status.started(self.port)


@dataclass(frozen=True, slots=True)
class Window:
    """One phase: from when its emails fell due until sink 1 had all of A's."""

    seconds: float
    first: int  # delivered to A (sink 1)
    second: int  # delivered to B (sink 2) meanwhile
    cpu_seconds: float  # every process of the service

    @property
    def first_rate(self) -> float:
        return self.first / self.seconds

    @property
    def second_rate(self) -> float:
        return self.second / self.seconds

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu_seconds / max(self.first + self.second, 1)

    @property
    def cores(self) -> float:
        """Cores the service kept busy: about 1 when its one delivery worker is the limit."""
        return self.cpu_seconds / self.seconds


async def _until(sink: Sink, count: int, seconds: float) -> bool:
    """Whether the sink has `count` messages in all within `seconds`."""
    try:
        await sink.wait_for_messages(count, timeout=seconds)
    except trio.TooSlowError:
        return False
    return True


async def _window(
    pid: int, sinks: tuple[Sink, Sink], due: datetime, count: int, profile: Path | None
) -> Window:
    """Time one phase from just before `due` until sink 1 has `count` more messages; with
    `profile` (a path prefix), py-spy records the service's processes meanwhile."""
    first, second = sinks
    before = received(first), received(second)
    ahead = (due - datetime.now(UTC)).total_seconds() - 0.3
    if ahead < 0:
        print("  a phase fell due before the last one was over", flush=True)
    await trio.sleep(max(ahead, 0))
    spies = start_spies(pid, profile) if profile else []
    cpu = tree_cpu_seconds(pid)
    if not await _until(first, before[0] + count, 600):
        print(f"  sink 1 had {received(first) - before[0]} of {count} after 600 s", flush=True)
    cpu = tree_cpu_seconds(pid) - cpu
    await trio.to_thread.run_sync(stop_spies, spies)
    return Window(
        (datetime.now(UTC) - due).total_seconds(),
        received(first) - before[0],
        received(second) - before[1],
        cpu,
    )


async def measure(
    engine: str,
    variant: str,
    runs: int,
    count: int,
    slowest: float,
    profile: Path | None,
    serve: list[str],
) -> list[tuple[Window, Window]]:
    """`runs` pairs of phases (alone, with B) on one engine with B's sink as `variant` says;
    `slowest` (emails/s) is the rate the phases are spaced for; with `profile`, py-spy
    records each phase into that folder; `serve`: more arguments for `postroom serve`."""
    delay = VARIANTS[variant]
    pairs = []
    async with trio.open_nursery() as nursery, c_sink_mail(nursery) as (dns_server, sink):
        second: Sink = (
            CSink(SECOND_SITE, sink.port)
            if delay is None
            else SiteSink(SECOND_SITE, sink.port, delay)
        )
        await nursery.start(second.run)
        dns_server.set(SECOND_DOMAIN, "MX", [f"10 mx.{SECOND_DOMAIN}."])
        dns_server.set(f"mx.{SECOND_DOMAIN}", "A", [SECOND_SITE])
        async with sending_service(engine, dns_server, sink.port, serve=serve) as (service, api):
            # send_at is at least a minute ahead; accepting 3 x count per run comes first.
            due = datetime.now(UTC) + timedelta(seconds=65 + 3 * runs * count / 1000)
            spacing = {
                ALONE: timedelta(seconds=5 + count / slowest),
                # A's and B's mail, and B's drain once a slow sink answers at once again.
                WITH_B: timedelta(seconds=5 + 2 * count / slowest + (delay or 0)),
            }
            plan: list[dict[str, datetime]] = []
            for run in range(runs):
                # Every other run takes the phase with B first: whatever favours the first
                # (or second) phase of a run weighs on both sides of the ratio alike.
                plan.append({})
                for phase in (ALONE, WITH_B) if run % 2 == 0 else (WITH_B, ALONE):
                    plan[-1][phase] = due
                    await schedule(api, f"{run}-{phase}", count, due)
                    if phase == WITH_B:
                        await schedule(api, f"{run}-{phase}", count, due, SECOND_DOMAIN)
                    due += spacing[phase]
            for run, dues in enumerate(plan):
                windows = {}
                for phase, due in dues.items():
                    drained = received(second) + count  # B's mail all in
                    prefix = (
                        profile / f"{engine}-{variant}-run{run + 1}-{phase}" if profile else None
                    )
                    windows[phase] = await _window(service.pid, (sink, second), due, count, prefix)
                    if phase == ALONE:
                        continue
                    if isinstance(second, SiteSink):
                        second.data_delay = 0  # B's backlog drains before the next phase
                    left = (due + spacing[phase] - datetime.now(UTC)).total_seconds() - 1
                    if not await _until(second, drained, max(left, 1)):
                        print("  B's mail had not drained before the next phase", flush=True)
                    if isinstance(second, SiteSink):
                        second.data_delay = delay or 0.0
                pairs.append((windows[ALONE], windows[WITH_B]))
                _print_run(engine, variant, run, *pairs[-1])
        nursery.cancel_scope.cancel()
    return pairs


def _print_run(engine: str, variant: str, run: int, alone: Window, both: Window) -> None:
    print(
        f"  {engine} {variant} run {run + 1}: alone {alone.first_rate:.0f}/s to A"
        f" ({alone.cpu_ms:.2f} CPU ms/email, {alone.cores:.2f} cores, {alone.second} to B);"
        f" with B {both.first_rate:.0f}/s to A and {both.second_rate:.0f}/s to B"
        f" ({both.cpu_ms:.2f} CPU ms/email, {both.cores:.2f} cores): A with B / A alone"
        f" {both.first_rate / alone.first_rate:.2f}x,"
        f" A+B / A alone {(both.first + both.second) / both.seconds / alone.first_rate:.2f}x",
        flush=True,
    )


def summary(pairs: list[tuple[Window, Window]]) -> dict[str, Any]:
    """Medians over the runs: the rates, each run's ratios, CPU per email."""
    ratios = [both.first_rate / alone.first_rate for alone, both in pairs]
    totals = [(both.first + both.second) / both.seconds / alone.first_rate for alone, both in pairs]
    return {
        "alone": median([alone.first_rate for alone, _ in pairs]),
        "with_b": median([both.first_rate for _, both in pairs]),
        "b": median([both.second_rate for _, both in pairs]),
        "ratio": median(ratios),
        "ratios": ", ".join(f"{r:.2f}" for r in ratios),
        "total": median(totals),
        "cpu_alone": median([alone.cpu_ms for alone, _ in pairs]),
        "cpu_both": median([both.cpu_ms for _, both in pairs]),
    }


def verdict(variant: str, found: dict[str, dict[str, Any]]) -> str:
    """One line: does a second site of this kind lower the rate to the first, on any engine?"""
    worst = min(found.values(), key=lambda r: r["ratio"])
    engines = ", ".join(f"{engine} {r['ratio']:.2f}x" for engine, r in found.items())
    if worst["ratio"] >= NOT_LOWERED:
        return (
            f"{variant} second site: the rate to the first is not lowered ({engines} of its"
            f" rate alone; {NOT_LOWERED:.0%} or more counts as not lowered)"
        )
    lowered = f"{variant} second site: the rate to the first is lowered ({engines} of alone)"
    if worst["total"] >= NOT_LOWERED:
        return (
            f"{lowered}, while A+B together keep {worst['total']:.2f}x of A's rate alone:"
            " the sites share the CPU (one delivery worker's, or the machine's), none is lost"
        )
    return f"{lowered}, and A+B together make only {worst['total']:.2f}x of A alone"


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--count", type=int, default=3000, help="emails per domain and phase")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--slowest", type=float, default=150, help="emails/s the phases are spaced for"
    )
    parser.add_argument("--profile", type=Path, help="py-spy each phase into DIR")
    parser.add_argument("--serve", default="", help="more arguments for `postroom serve`")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    for variant in args.variants.split(","):
        found = {}
        for engine in args.engines.split(","):
            pairs = trio.run(
                measure,
                engine,
                variant,
                args.runs,
                args.count,
                args.slowest,
                args.profile,
                args.serve.split(),
            )
            r = found[engine] = summary(pairs)
            print(
                f"{engine:<11} B {variant}: A alone {r['alone']:.0f}/s"
                f" ({r['cpu_alone']:.2f} CPU ms/email), A with B {r['with_b']:.0f}/s"
                f" (B {r['b']:.0f}/s, {r['cpu_both']:.2f} CPU ms/email);"
                f" with B / alone {r['ratio']:.2f}x (runs {r['ratios']}),"
                f" A+B / A alone {r['total']:.2f}x",
                flush=True,
            )
        print(verdict(variant, found), flush=True)
    print(f"load average after: {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()
