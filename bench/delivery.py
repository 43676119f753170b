"""End-to-end sending benchmark, side by side with Postfix: `python bench/delivery.py`.

Starts `postroom serve` in a child process over a fresh database, with this process running
the project's test DNS server and SMTP sink on loopback (the recipients' MX). For each engine
it prints, as the median of `--runs` runs:

- accept:   POST /v1/emails/ (one recipient) requests/s with p50/p99 latency, flat out, while
            the delivery engine works at the same time;
- half:     p99 latency with the load paced at half that rate;
- batch:    POST /v1/emails/batch of 100 emails, in emails/s;
- e2e:      emails/s from the first accept to the sink's 250 for the last of them.

Then Postfix (a private instance, see bench/postfix.py), stock and tuned for throughput,
relays the same number of messages to the same kind of sink, injected with Postfix's own
`smtp-source` over 50 connections; it prints Postfix's SMTP accept rate and its end-to-end
rate, and the ratio Postroom / Postfix.

`--sinks python,c` says which MX receives: the project's Python test sink (the default) or
Postfix's C `smtp-sink`, which leaves the machine's cores to the sender; each sink is a run
of its own, and Postfix relays to the same sink as Postroom.

`--delivery-cpu N` measures the delivery path alone instead: N emails per run are accepted
in batches, scheduled a minute ahead (each run a little later), and from just before a run
falls due until the sink has it all it reads the CPU time of the service's processes (every
worker) from /proc; it prints CPU milliseconds per delivered email and the delivery rate
(median of `--runs`). Unless `--no-postfix`, right after each of Postroom's runs Postfix
stock and tuned (started beforehand, idle meanwhile) each relay N messages injected with
`smtp-source` to the same sink: their rate from the first injected message to the last at
the sink and their CPU per message (every Postfix process, smtpd's receiving included,
which Postroom's delivery figure leaves out: the CPU Postroom spent accepting the batches
is printed beside it), and the ratios Postroom / Postfix of that run, so a noisy machine
weighs on both sides of a ratio alike. With `--profile DIR`, py-spy (`--gil`: the samples say
where the interpreter's time goes) records every process of the service from just before a
run falls due until the sink has it all, into DIR/<sink>/<engine>-run<N>-<pid>.txt (collapsed
stacks).
"""

from __future__ import annotations

import argparse
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import postfix
from bench.api_throughput import REPO
from bench.peers import (
    RECIPIENT_DOMAIN,
    Running,
    bench_parser,
    c_sink_mail,
    loopback_mail,
    postroom_process,
    until_healthy,
    verified_domain,
)
from bench.postfix import CSink, tree_cpu_seconds
from bench.stats import median, median_run
from bench.wrk import process_tree
from engine.delivery.policies import DEFAULT_CONNECTIONS
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

DOMAIN = "bench.example.org"
Sink = SmtpSink | CSink
POSTFIX_SETTINGS = ("stock", "tuned")


def received(sink: Sink) -> int:
    """Messages the sink has accepted in all."""
    return sink.received if isinstance(sink, CSink) else len(sink.messages)


async def ready_to_send(api: httpx.AsyncClient, dns_server: DnsServer) -> None:
    """Wait for the service, then register DOMAIN (DKIM published, verified) and its sender."""
    await until_healthy(api)
    await verified_domain(api, dns_server, DOMAIN)
    await api.post("/v1/senders/", json={"email": f"news@{DOMAIN}"})


@asynccontextmanager
async def sending_service(
    engine: str,
    dns_server: DnsServer,
    sink_port: int,
    settings: dict[str, str] | None = None,
    serve: Sequence[str] = (),
) -> AsyncIterator[tuple[Running, httpx.AsyncClient]]:
    """`postroom serve` on `engine` delivering to `sink_port` with `dns_server` as its resolver
    (`settings`: more POSTROOM_* values, `serve`: more arguments), DOMAIN ready to send from,
    and an API client with the account's key."""
    # The sinks listen on loopback, which the private-network rule refuses by default.
    async with (
        postroom_process(
            engine,
            None,
            serve=serve,
            **{
                "dns_servers": dns_server.nameserver,
                "delivery_port": str(sink_port),
                "allow_private_targets": "on",
                **(settings or {}),
            },
        ) as service,
        httpx.AsyncClient(
            base_url=service.url,
            headers={"Authorization": f"Bearer {service.key}"},
            timeout=60,
        ) as api,
    ):
        await ready_to_send(api, dns_server)
        yield service, api


def _body(n: str, recipient_domain: str = RECIPIENT_DOMAIN) -> dict[str, Any]:
    return {
        "from_": {"email": f"news@{DOMAIN}"},
        "to": [{"email": f"reader{n}@{recipient_domain}"}],
        "subject": "Benchmark",
        "text": "Hello from the benchmark.",
    }


async def schedule(
    api: httpx.AsyncClient,
    tag: str,
    count: int,
    due: datetime,
    recipient_domain: str = RECIPIENT_DOMAIN,
) -> None:
    """Accept `count` emails to `recipient_domain` (readers `<tag>-<n>`) in batches of 100,
    all due at `due`, so that their delivery can be timed alone once they fall due."""
    for start in range(0, count, 100):
        batch = [
            _body(f"{tag}-{n}", recipient_domain) | {"send_at": due.isoformat()}
            for n in range(start, min(start + 100, count))
        ]
        response = await api.post("/v1/emails/batch", json=batch)
        response.raise_for_status()


async def _arrived(sink: Sink, count: int, seconds: float) -> None:
    try:
        await sink.wait_for_messages(count, timeout=seconds)
    except trio.TooSlowError:
        print(f"  (the sink had {received(sink)} of {count} after {seconds} s)", flush=True)


async def load(
    url: str, key: str, path: str, body: str, seconds: float, start: int, rate: float = 0.0
) -> dict[str, Any]:
    """One run of bench/load.py (50 connections) in its own process."""
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
        "--rate",
        str(rate),
    ]
    done = await trio.run_process(command, capture_stdout=True)
    result: dict[str, Any] = json.loads(done.stdout)
    return result


Peers = Callable[[trio.Nursery], AbstractAsyncContextManager[tuple[DnsServer, Sink]]]
SINKS: dict[str, Peers] = {"python": loopback_mail, "c": c_sink_mail}


def start_spies(pid: int, prefix: Path) -> list[subprocess.Popen[bytes]]:
    """py-spy on `pid` and each of its descendants, 100 samples/s, until SIGINT."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    record = [spy, "record", "--gil", "--nonblocking", "-r", "100", "-f", "raw"]
    return [
        subprocess.Popen(
            [*record, "-p", str(member), "-o", f"{prefix}-{member}.txt"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for member in process_tree(pid)
    ]


def stop_spies(spies: list[subprocess.Popen[bytes]]) -> None:
    for spy in spies:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it sampled
    for spy in spies:
        spy.wait(timeout=60)


async def postfix_run(instance: postfix.Instance, sink: Sink, count: int) -> dict[str, float]:
    """`count` messages injected with smtp-source into `instance`: the rate from the first
    injected to the last at the sink, CPU ms per message, and smtpd's accept rate."""
    before, cpu = received(sink), instance.cpu_seconds()
    started = time.perf_counter()
    accept = await trio.to_thread.run_sync(postfix.smtp_source, instance.port, count)
    await _arrived(sink, before + count, 120)
    seconds = time.perf_counter() - started
    delivered = received(sink) - before
    return {
        "per_s": delivered / seconds,
        "cpu_ms": 1000 * (instance.cpu_seconds() - cpu) / max(delivered, 1),
        "accept_per_s": accept,
    }


async def delivery_cpu(
    engine: str,
    runs: int,
    count: int,
    peers: Peers = loopback_mail,
    after: Callable[[httpx.AsyncClient], Awaitable[None]] | None = None,
    versus: tuple[str, ...] = (),
    settings: dict[str, str] | None = None,
    profile: Path | None = None,
    serve: Sequence[str] = (),
) -> dict[str, Any]:
    """CPU milliseconds of the service per delivered email, and the delivery rate; the mail
    goes to the sink `peers` starts (the plain loopback one by default), `settings` are more
    POSTROOM_* values for the service, and `after(api)` checks what was delivered. `versus`
    names Postfix settings ("stock", "tuned") each relaying `count` messages to the same
    sink after each run (see the module's header); with `profile`, py-spy records each run
    into that folder; `serve`: more arguments for `postroom serve`."""
    per_email, rates, accept_ms = [], [], []
    theirs: dict[str, list[dict[str, float]]] = {name: [] for name in versus}
    async with (
        trio.open_nursery() as nursery,
        peers(nursery) as (dns_server, sink),
        AsyncExitStack() as stack,
    ):
        instances = {
            name: stack.enter_context(
                postfix.postfix_instance(
                    sink.port, tuned=name == "tuned", connections=DEFAULT_CONNECTIONS
                )
            )
            for name in versus
        }
        async with sending_service(engine, dns_server, sink.port, settings, serve) as (
            service,
            api,
        ):
            # Every run is accepted first, each due at its own time: send_at is at least a
            # minute ahead, and a run must not overlap the next.
            first = datetime.now(UTC) + timedelta(seconds=65 + runs * count / 100)
            # Each Postfix relays `count` messages between two runs.
            spacing = timedelta(seconds=5 + count / 50 + len(versus) * count / 250)
            dues = [first + run * spacing for run in range(runs)]
            cpu = tree_cpu_seconds(service.pid)
            for run, due in enumerate(dues):
                await schedule(api, str(run), count, due)
            accept_ms.append(1000 * (tree_cpu_seconds(service.pid) - cpu) / (runs * count))
            for run, due in enumerate(dues):
                before = received(sink)
                ahead = (due - datetime.now(UTC)).total_seconds() - 0.3
                if ahead < 0:
                    print(f"  run {run + 1} fell due before the last one was over", flush=True)
                await trio.sleep(max(ahead, 0))
                prefix = profile / f"{engine}-run{run + 1}" if profile else None
                spies = start_spies(service.pid, prefix) if prefix else []
                cpu = tree_cpu_seconds(service.pid)
                await _arrived(sink, before + count, spacing.total_seconds())
                cpu = tree_cpu_seconds(service.pid) - cpu
                await trio.to_thread.run_sync(stop_spies, spies)
                seconds = (datetime.now(UTC) - due).total_seconds()
                delivered = received(sink) - before
                per_email.append(1000 * cpu / max(delivered, 1))
                rates.append(delivered / seconds)
                print(
                    f"  {engine} run {run + 1}: {delivered} delivered in {seconds:.2f} s,"
                    f" {cpu:.2f} CPU s ({per_email[-1]:.2f} ms per email)",
                    flush=True,
                )
                for name, instance in instances.items():
                    found = await postfix_run(instance, sink, count)
                    found["ratio"] = rates[-1] / found["per_s"]
                    found["cpu_ratio"] = per_email[-1] / found["cpu_ms"]
                    theirs[name].append(found)
                    print(
                        f"    postfix {name} run {run + 1}: {found['per_s']:.0f} msg/s,"
                        f" {found['cpu_ms']:.2f} CPU ms per message (smtpd accepted"
                        f" {found['accept_per_s']:.0f}/s); Postroom/Postfix {name}:"
                        f" rate {found['ratio']:.2f}x, CPU {found['cpu_ratio']:.2f}x",
                        flush=True,
                    )
            if after is not None:
                await after(api)
        nursery.cancel_scope.cancel()
    return {
        "engine": engine,
        "cpu_ms_per_email": median(per_email),
        "delivered_per_s": median(rates),
        "accept_cpu_ms_per_email": median(accept_ms),
        "postfix": {
            name: {key: median([run[key] for run in found]) for key in found[0]}
            for name, found in theirs.items()
        },
    }


async def postroom_figures(
    engine: str, runs: int, seconds: float, sink_name: str = "python"
) -> dict[str, Any]:
    """Accept (flat out and at half rate), batch and end-to-end figures for one engine."""
    peers = SINKS[sink_name]
    async with trio.open_nursery() as nursery, peers(nursery) as (dns_server, sink):
        # The sink listens on loopback, which the private-network rule refuses by default.
        async with postroom_process(
            engine,
            dns_servers=dns_server.nameserver,
            delivery_port=str(sink.port),
            allow_private_targets="on",
        ) as service:
            async with httpx.AsyncClient(
                base_url=service.url, headers={"Authorization": f"Bearer {service.key}"}
            ) as api:
                await ready_to_send(api, dns_server)
            accepts, halves, batches, e2e, delivered = [], [], [], [], []
            single = json.dumps(_body("{n}"))
            batch = json.dumps([_body(f"{{n}}-{i}") for i in range(100)])
            for run in range(runs):
                before = received(sink)
                started = time.perf_counter()
                result = await load(
                    service.url, service.key, "/v1/emails/", single, seconds, run * 10**7
                )
                accepted = result["statuses"].get("202", 0)
                await _arrived(sink, before + accepted, 120)
                delivered.append(received(sink) - before)
                e2e.append(delivered[-1] / (time.perf_counter() - started))
                accepts.append(result)
                half = await load(
                    service.url,
                    service.key,
                    "/v1/emails/",
                    single,
                    seconds,
                    2 * 10**8 + run * 10**7,
                    rate=result["rate"] / 2,
                )
                halves.append(half)
                before = received(sink)
                result = await load(
                    service.url,
                    service.key,
                    "/v1/emails/batch",
                    batch,
                    seconds,
                    5 * 10**8 + run * 10**7,
                )
                batches.append(result["rate"] * 100)
                await _arrived(sink, before + result["statuses"].get("202", 0) * 100, 300)
        nursery.cancel_scope.cancel()
    accept = median_run(accepts)
    return {
        "engine": engine,
        "accept_rate": accept["rate"],
        "accept_p50_ms": accept["p50_ms"],
        "accept_p99_ms": accept["p99_ms"],
        "accept_runs": accept["runs"],
        "half_rate_p99_ms": median([h["p99_ms"] for h in halves]),
        "batch_emails_per_s": median(batches),
        "e2e_per_s": median(e2e),
        "e2e_messages": int(median([float(d) for d in delivered])),
    }


async def postfix_figures(
    count: int, runs: int, sink_name: str = "python", tuned: bool = False
) -> dict[str, Any] | None:
    """Postfix (stock or tuned) relaying `count` messages to the sink: SMTP accept rate,
    end-to-end rate and CPU per message."""
    why = postfix.missing()
    if why is not None:
        print(f"  {why}", flush=True)
        return None
    found, relay_client = [], []
    sink: Sink
    async with trio.open_nursery() as nursery:
        sink = CSink() if sink_name == "c" else SmtpSink()
        await nursery.start(sink.run)
        with postfix.postfix_instance(sink.port, tuned, DEFAULT_CONNECTIONS) as instance:
            for _ in range(runs):
                found.append(await postfix_run(instance, sink, count))
            if (Path(__file__).parent / "relay.py").exists():
                for _ in range(runs):
                    relay_client.append(await postfix.relay_client(instance.port))
        nursery.cancel_scope.cancel()
    return {
        "accept_rate": median([run["accept_per_s"] for run in found]),
        "e2e_per_s": median([run["per_s"] for run in found]),
        "cpu_ms": median([run["cpu_ms"] for run in found]),
        "messages": count,
        "relay_client_accept": median(relay_client),
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--no-postfix", action="store_true", help="Postroom figures only")
    parser.add_argument(
        "--delivery-cpu", type=int, metavar="N", help="CPU per email delivering N emails"
    )
    parser.add_argument("--sinks", default="python", help="python, c or python,c")
    parser.add_argument("--profile", type=Path, help="--delivery-cpu: py-spy each run into DIR")
    parser.add_argument(
        "--serve", default="", help="--delivery-cpu: more arguments for `postroom serve`"
    )
    args = parser.parse_args()
    versus = () if args.no_postfix or postfix.missing() else POSTFIX_SETTINGS
    if not args.no_postfix and postfix.missing():
        print(postfix.missing(), flush=True)
    for sink in args.sinks.split(","):
        if args.profile:
            (args.profile / sink).mkdir(parents=True, exist_ok=True)
        if args.delivery_cpu:
            for engine in args.engines.split(","):
                r = trio.run(
                    partial(
                        delivery_cpu,
                        engine,
                        args.runs,
                        args.delivery_cpu,
                        peers=SINKS[sink],
                        versus=versus,
                        profile=args.profile / sink if args.profile else None,
                        serve=args.serve.split(),
                    )
                )
                print(
                    f"{engine:<11} {sink} sink: delivery {r['cpu_ms_per_email']:.2f} CPU ms"
                    f" per email (accepting the batches {r['accept_cpu_ms_per_email']:.2f})"
                    f"   {r['delivered_per_s']:.0f} emails/s",
                    flush=True,
                )
                for name, theirs in r["postfix"].items():
                    print(
                        f"  postfix {name:<6} {theirs['per_s']:.0f} msg/s,"
                        f" {theirs['cpu_ms']:.2f} CPU ms per message;"
                        f" Postroom/Postfix rate {theirs['ratio']:.2f}x,"
                        f" CPU {theirs['cpu_ratio']:.2f}x (medians of the runs' ratios)",
                        flush=True,
                    )
            continue
        e2e_figures(args, sink)


def e2e_figures(args: argparse.Namespace, sink: str) -> None:
    """Accept, batch and end to end per engine, then Postfix stock and tuned."""
    results = []
    for engine in args.engines.split(","):
        r = trio.run(postroom_figures, engine, args.runs, args.seconds, sink)
        results.append(r)
        print(
            f"{engine:<11} {sink} sink: accept {r['accept_rate']:>6.0f} req/s"
            f"  p50 {r['accept_p50_ms']:.1f} ms  p99 {r['accept_p99_ms']:.1f} ms"
            f" (p99 at half rate {r['half_rate_p99_ms']:.1f} ms)"
            f"   batch {r['batch_emails_per_s']:>6.0f} emails/s"
            f"   e2e {r['e2e_per_s']:>5.0f} emails/s  (accept runs: {r['accept_runs']})",
            flush=True,
        )
    if args.no_postfix:
        return
    count = max(r["e2e_messages"] for r in results)
    for name in POSTFIX_SETTINGS:
        theirs = trio.run(postfix_figures, count, args.runs, sink, name == "tuned")
        if theirs is None:
            return
        print(
            f"postfix {name:<6} SMTP accept {theirs['accept_rate']:>5.0f} msg/s"
            f"   e2e {theirs['e2e_per_s']:>5.0f} msg/s, {theirs['cpu_ms']:.2f} CPU ms/message"
            f"  ({count} messages, smtp-source -s 50);"
            f" with bench/relay.py's client {theirs['relay_client_accept']:.0f} msg/s",
            flush=True,
        )
        for r in results:
            ratio = r["e2e_per_s"] / theirs["e2e_per_s"]
            print(f"  e2e {r['engine']}/postfix {name}: {ratio:.2f}x")


if __name__ == "__main__":
    main()
