"""Webhook fan-out benchmark: `python bench/webhooks.py [--engines sqlite,postgresql]`.

Starts `postroom serve` in a child process, with this process running the test DNS server,
SMTP sink and HTTPS receiver (trustme certificate, trusted through POSTROOM_EXTRA_CA_FILE).
It registers `--webhooks` webhooks for `email.sent` and `email.delivered`, sends `--emails`
emails in batches of 100, and reports the rate at which signed deliveries reach the receiver
(first to last), as the median of `--runs` runs, with the CPU milliseconds the service's
processes spent per webhook delivery (the emails' own delivery included: it is what makes
the events).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import wrk
from bench.delivery import DOMAIN, ready_to_send
from bench.peers import (
    RECIPIENT_DOMAIN,
    Running,
    bench_parser,
    loopback_mail,
    postroom_process,
)
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.tls import make_authority


def _email(n: int) -> dict[str, Any]:
    return {
        "from_": {"email": f"news@{DOMAIN}"},
        "to": [{"email": f"reader{n}@{RECIPIENT_DOMAIN}"}],
        "subject": "Fan-out",
        "text": "Hello.",
    }


async def fan_out(engine: str, args: argparse.Namespace) -> dict[str, Any]:
    """Signed deliveries/s reaching the receiver for one engine: median and every run."""
    with tempfile.TemporaryDirectory() as tmp:
        authority = make_authority(Path(tmp))
        receiver = HttpsReceiver(authority.server_context())
        async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, sink):
            await nursery.start(receiver.run)
            async with postroom_process(
                engine,
                dns_servers=dns_server.nameserver,
                delivery_port=str(sink.port),
                extra_ca_file=str(authority.ca_file),
                allow_private_targets="on",
            ) as service:
                runs = await _measure(service, dns_server, receiver, args)
            nursery.cancel_scope.cancel()
    return {
        "engine": engine,
        "rate": statistics.median(rate for rate, _ in runs),
        "cpu_ms": statistics.median(cpu for _, cpu in runs),
        "runs": ", ".join(f"{rate:.0f}" for rate, _ in runs),
    }


async def _measure(
    service: Running, dns_server: DnsServer, receiver: HttpsReceiver, args: argparse.Namespace
) -> list[tuple[float, float]]:
    """(deliveries/s, CPU ms per delivery) of each run."""
    async with httpx.AsyncClient(
        base_url=service.url, headers={"Authorization": f"Bearer {service.key}"}, timeout=60
    ) as api:
        await ready_to_send(api, dns_server)
        for i in range(args.webhooks):
            hook = {"url": f"{receiver.url}/hook/{i}", "events": ["email.sent", "email.delivered"]}
            assert (await api.post("/v1/webhooks/", json=hook)).status_code == 201
        runs = []
        for run in range(args.runs):
            before = len(receiver.requests)
            cpu = wrk.cpu_seconds(service.pid)
            expected = before + args.emails * 2 * args.webhooks
            for start in range(0, args.emails, 100):
                batch = [
                    _email(run * 10**6 + n) for n in range(start, min(start + 100, args.emails))
                ]
                assert (await api.post("/v1/emails/batch", json=batch)).status_code == 202
            try:
                await receiver.wait_for_requests(expected, timeout=600)
            except trio.TooSlowError:
                print(
                    f"  (the receiver got {len(receiver.requests) - before} of {expected - before})"
                )
            window = receiver.requests[before:]
            elapsed = window[-1].received_at - window[0].received_at
            cpu_ms = (wrk.cpu_seconds(service.pid) - cpu) * 1000 / max(len(window), 1)
            runs.append((len(window) / elapsed if elapsed > 0 else 0.0, cpu_ms))
        return runs


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--emails", type=int, default=500)
    parser.add_argument("--webhooks", type=int, default=5)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        result = trio.run(fan_out, engine, args)
        print(
            f"{engine:<11} fan-out {result['rate']:>7.0f} signed deliveries/s"
            f" ({result['cpu_ms']:.2f} ms CPU each)"
            f"  (runs: {result['runs']})",
            flush=True,
        )


if __name__ == "__main__":
    main()
