"""SMTP relay accept benchmark: `python bench/relay.py [--engines sqlite,postgresql]`.

Starts the service as `postroom serve` does, `--workers` processes (default: one per core)
in its roles (half of them delivering what the others take, which share the ports), over a fresh database (this script with `--serve`: a worker plus one
extra submission listener that allows AUTH in plaintext on loopback, which only this
benchmark starts, so TLS handshakes are not what is measured),
with this process running the test DNS server and SMTP sink (the recipients' MX). Client
processes (this script with `--client`) then send with Python's smtplib from many threads:
connect, EHLO, AUTH PLAIN, MAIL, RCPT, DATA, QUIT, one message per connection unless
`--per-connection` says more (`--profile DIR`: py-spy samples every worker during the first
run into DIR/relay-<engine>.txt, for `python bench/profile_steps.py DIR`). Prints, per engine, the median of `--runs` runs of accepted
messages/s (a 250 after DATA: committed), and how many the sink received in the end.

Then, when Postfix is installed (bench/postfix.py: a private instance relaying to the same
kind of sink), the same client against Postfix's smtpd without AUTH, and the ratio. The
client also runs on its own against any SMTP server (`--client --host H --port P
--no-auth`).
"""

from __future__ import annotations

import argparse
import json
import os
import smtplib
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import wrk
from bench.accept import _py_spy, _stop_spies
from bench.api_throughput import CREATE_ACCOUNT, REPO, _database, _free_port
from bench.peers import until_healthy, verified_domain
from engine.platform.nodes import Role
from postroom import workers
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink

DOMAIN = "relay-bench.example.org"
SENDER = f"news@{DOMAIN}"
MESSAGE = (
    f"From: News <{SENDER}>\r\nTo: reader@dest.example\r\nSubject: Relay benchmark\r\n"
    "\r\n" + "Hello from the relay benchmark.\r\n" * 20
)


# -- the client (its own process) --------------------------------------------------------


def _client_thread(args: argparse.Namespace, deadline: float, counts: list[int]) -> None:
    sent = errors = 0
    n = 0
    while time.perf_counter() < deadline:
        try:
            with smtplib.SMTP(args.host, args.port, timeout=30) as smtp:
                if not args.no_auth:
                    smtp.login(args.user, args.password)
                for _ in range(args.per_connection):
                    n += 1
                    smtp.sendmail(SENDER, [f"reader{n}@dest.example"], MESSAGE)
                    sent += 1
        except (smtplib.SMTPException, OSError):
            errors += 1
    counts.extend([sent, errors])


def client(args: argparse.Namespace) -> None:
    """Send for `--seconds` from `--threads` threads; print {"sent", "errors", "seconds"}."""
    started = time.perf_counter()
    deadline = started + args.seconds
    results: list[list[int]] = [[] for _ in range(args.threads)]
    threads = [
        threading.Thread(target=_client_thread, args=(args, deadline, results[i]))
        for i in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    sent = sum(r[0] for r in results)
    print(json.dumps({"sent": sent, "errors": sum(r[1] for r in results), "seconds": elapsed}))


# -- the service (its own process) -------------------------------------------------------


async def _serve(plain_port: int, role: Role) -> None:
    """One worker of the service in its `role`, as `postroom serve` starts each (its ports
    shared with the other workers); one that takes mail has the plaintext-AUTH listener beside
    it."""
    from postroom import config
    from postroom.service import serve
    from postroom.startup import settle_heap
    from relay.listener import MAX_CONNECTIONS
    from relay.submission import submission_listener

    async with trio.open_nursery() as nursery:
        settings = config.load(dict(os.environ))
        running = await nursery.start(partial(serve, settings, reuse_port=True, role=role))
        if role == "delivery":
            settle_heap()
            return
        plain = submission_listener(
            running.runtime,
            ("127.0.0.1", plain_port),
            None,
            auth_without_tls=True,
            max_per_client=MAX_CONNECTIONS,  # every client process connects from 127.0.0.1
        )
        plain.reuse_port = True
        await nursery.start(plain.run)
        settle_heap()


# -- the benchmark -----------------------------------------------------------------------


async def _setup(api: httpx.AsyncClient, dns_server: DnsServer) -> dict[str, Any]:
    """Wait for the service; a verified domain, its sender and an SMTP credential."""
    await until_healthy(api)
    domain_id = await verified_domain(api, dns_server, DOMAIN)
    await api.post("/v1/senders/", json={"email": SENDER})
    created = await api.post("/v1/smtp-credentials/", json={"domain_id": domain_id})
    credential: dict[str, Any] = created.json()
    return credential


async def _clients(port: int, credential: dict[str, Any], args: argparse.Namespace) -> float:
    """One run: `--clients` processes at once; accepted messages per second."""
    command = [
        sys.executable,
        str(REPO / "bench" / "relay.py"),
        "--client",
        "--port",
        str(port),
        f"--user={credential['username']}",
        # One argument: a generated password may begin with "-".
        f"--password={credential['password']}",
        "--seconds",
        str(args.seconds),
        "--threads",
        str(args.threads),
        "--per-connection",
        str(args.per_connection),
    ]
    outputs: list[dict[str, Any]] = []

    async def one() -> None:
        done = await trio.run_process(command, capture_stdout=True)
        outputs.append(json.loads(done.stdout))

    async with trio.open_nursery() as nursery:
        for _ in range(args.clients):
            nursery.start_soon(one)
    errors = sum(o["errors"] for o in outputs)
    if errors:
        print(f"  ({errors} connections failed)", flush=True)
    return float(sum(o["sent"] / o["seconds"] for o in outputs))


async def _postfix(args: argparse.Namespace) -> float | None:
    """The same client against a private Postfix relaying to a sink; msg/s, or None."""
    try:
        from bench import postfix
    except ImportError:
        print("postfix     (bench/postfix.py is not there: no comparison)", flush=True)
        return None
    reason = postfix.missing()
    if reason is not None:
        print(f"postfix     ({reason})", flush=True)
        return None
    sink = SmtpSink()
    async with trio.open_nursery() as nursery:
        await nursery.start(sink.run)
        with postfix.private_postfix(sink.port) as port:
            rates = [
                await postfix.relay_client(port, args.seconds, args.clients, args.threads)
                for _ in range(args.runs)
            ]
        nursery.cancel_scope.cancel()
    print(
        f"postfix     relay accept {statistics.median(rates):>7.0f} msg/s"
        f"  (runs: {', '.join(f'{r:.0f}' for r in rates)}; the same client, no AUTH)",
        flush=True,
    )
    return statistics.median(rates)


async def _run_engine(engine: str, args: argparse.Namespace) -> float:
    dns_server, sink = DnsServer(), SmtpSink()
    async with trio.open_nursery() as nursery:
        await nursery.start(dns_server.run)
        await nursery.start(sink.run)
        dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
        dns_server.set("mx.dest.example", "A", ["127.0.0.1"])
        with tempfile.TemporaryDirectory() as tmp, _database(engine, Path(tmp)) as db_url:
            api_port, plain_port = _free_port(), _free_port()
            env = {
                "POSTROOM_DATABASE_URL": db_url,
                "POSTROOM_API_LISTEN": f"127.0.0.1:{api_port}",
                "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{_free_port()}",
                "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{_free_port()}",
                "POSTROOM_DNS_SERVERS": dns_server.nameserver,
                "POSTROOM_DELIVERY_PORT": str(sink.port),
                "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",  # the sink and peers are on loopback
                "PYTHONPATH": str(REPO),
                "PATH": "/usr/bin:/bin",
            }
            created = await trio.run_process(
                [sys.executable, "-m", "postroom", *CREATE_ACCOUNT],
                env=env,
                cwd=tmp,
                capture_stdout=True,
            )
            key = json.loads(created.stdout)["api_key"]
            servers = []
            for role in workers.roles(args.workers, None):
                servers.append(
                    await trio.lowlevel.open_process(
                        [
                            sys.executable,
                            str(REPO / "bench" / "relay.py"),
                            "--serve",
                            str(plain_port),
                            "--role",
                            role,
                        ],
                        env=env,
                        cwd=tmp,
                        stderr=subprocess.DEVNULL,
                    )
                )
            try:
                async with httpx.AsyncClient(
                    base_url=f"http://127.0.0.1:{api_port}",
                    headers={"Authorization": f"Bearer {key}"},
                ) as api:
                    credential = await _setup(api, dns_server)
                rates, cpu_ms = [], []
                for run in range(args.runs):
                    spies, parts = [], []
                    if args.profile is not None and run == 0:
                        parts = [args.profile / f"relay-{engine}-{s.pid}.part" for s in servers]
                        spies = [
                            _py_spy(s.pid, part) for s, part in zip(servers, parts, strict=True)
                        ]
                    pids = [server.pid for server in servers]
                    cpu = sum(wrk.cpu_seconds(pid) for pid in pids)
                    rates.append(await _clients(plain_port, credential, args))
                    spent = sum(wrk.cpu_seconds(pid) for pid in pids) - cpu
                    cpu_ms.append(spent * 1000 / max(rates[-1] * args.seconds, 1))
                    if spies:
                        out = args.profile / f"relay-{engine}.txt"
                        await trio.to_thread.run_sync(_stop_spies, spies, parts, out)
                        out.with_suffix(".emails").write_text(f"{rates[-1] * args.seconds:.0f}")
                rate = statistics.median(rates)
                print(
                    f"{engine:<11} relay accept {statistics.median(rates):>7.0f} msg/s"
                    f"  (runs: {', '.join(f'{r:.0f}' for r in rates)};"
                    f" {args.clients}x{args.threads} smtplib connections,"
                    f" {args.per_connection} message(s) each; {args.workers} workers;"
                    f" sink got {len(sink.messages)};"
                    f" {statistics.median(cpu_ms):.2f} ms CPU of the workers per message,"
                    " delivery included)",
                    flush=True,
                )
            finally:
                for server in servers:
                    server.terminate()
                for server in servers:
                    await server.wait()
        nursery.cancel_scope.cancel()
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4, help="client processes")
    parser.add_argument("--threads", type=int, default=8, help="connections per process")
    parser.add_argument("--per-connection", type=int, default=1)
    parser.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="service processes sharing the ports (default: one per core, as `postroom serve`)",
    )
    parser.add_argument("--serve", type=int, metavar="PLAIN_PORT", help=argparse.SUPPRESS)
    parser.add_argument("--role", default="all", help=argparse.SUPPRESS)
    parser.add_argument("--client", action="store_true", help="run only the client")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=2587)
    parser.add_argument("--user", default="")
    parser.add_argument("--password", default="")
    parser.add_argument("--no-auth", action="store_true")
    parser.add_argument(
        "--no-postfix", dest="postfix", action="store_false", help="skip the Postfix comparison"
    )
    parser.add_argument("--profile", type=Path, help="py-spy the workers' first run into DIR")
    args = parser.parse_args()
    if args.profile is not None:
        args.profile.mkdir(parents=True, exist_ok=True)
    if args.serve is not None:
        trio.run(_serve, args.serve, args.role)
    elif args.client:
        client(args)
    else:
        ours = {engine: trio.run(_run_engine, engine, args) for engine in args.engines.split(",")}
        theirs = trio.run(_postfix, args) if args.postfix else None
        if theirs:
            ratios = ", ".join(f"{engine} {rate / theirs:.2f}x" for engine, rate in ours.items())
            print(f"ratio to Postfix: {ratios}", flush=True)


if __name__ == "__main__":
    main()
