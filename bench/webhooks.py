"""Webhook fan-out benchmark: `python bench/webhooks.py [--engines sqlite,postgresql]`.

Starts `postroom serve` in a child process, with this process running the test DNS server,
SMTP sink and HTTPS receiver (trustme certificate, trusted through POSTROOM_EXTRA_CA_FILE).
It registers `--webhooks` webhooks for `email.sent` and `email.delivered`, sends `--emails`
emails in batches of 100, and reports the rate at which signed deliveries reach the receiver
(first to last), as the median of `--runs` runs.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_throughput import CREATE_ACCOUNT, REPO, _database, _free_port
from bench.delivery import DOMAIN, ready_to_send
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import make_authority


def _email(n: int) -> dict[str, Any]:
    return {
        "from_": {"email": f"news@{DOMAIN}"},
        "to": [{"email": f"reader{n}@dest.example"}],
        "subject": "Fan-out",
        "text": "Hello.",
    }


async def _run_engine(engine: str, args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        authority = make_authority(Path(tmp))
        dns_server, sink, receiver = (
            DnsServer(),
            SmtpSink(),
            HttpsReceiver(authority.server_context()),
        )
        async with trio.open_nursery() as nursery:
            for peer in (dns_server, sink, receiver):
                await nursery.start(peer.run)
            dns_server.set("dest.example", "MX", ["10 mx.dest.example."])
            dns_server.set("mx.dest.example", "A", ["127.0.0.1"])
            with _database(engine, Path(tmp)) as db_url:
                port = _free_port()
                env = {
                    "POSTROOM_DATABASE_URL": db_url,
                    "POSTROOM_API_LISTEN": f"127.0.0.1:{port}",
                    "POSTROOM_DNS_SERVERS": dns_server.nameserver,
                    "POSTROOM_DELIVERY_PORT": str(sink.port),
                    "POSTROOM_EXTRA_CA_FILE": str(authority.ca_file),
                    "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
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
                    rates = await _measure(
                        f"http://127.0.0.1:{port}", key, dns_server, receiver, args
                    )
                finally:
                    server.terminate()
                    await server.wait()
            print(
                f"{engine:<11} fan-out {statistics.median(rates):>7.0f} signed deliveries/s"
                f"  (runs: {', '.join(f'{r:.0f}' for r in rates)})",
                flush=True,
            )
            nursery.cancel_scope.cancel()


async def _measure(
    url: str, key: str, dns_server: DnsServer, receiver: HttpsReceiver, args: argparse.Namespace
) -> list[float]:
    async with httpx.AsyncClient(
        base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60
    ) as api:
        await ready_to_send(api, dns_server)
        for i in range(args.webhooks):
            hook = {"url": f"{receiver.url}/hook/{i}", "events": ["email.sent", "email.delivered"]}
            assert (await api.post("/v1/webhooks/", json=hook)).status_code == 201
        rates = []
        for run in range(args.runs):
            before = len(receiver.requests)
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
            rates.append(len(window) / elapsed if elapsed > 0 else 0.0)
        return rates


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--engines", default="sqlite,postgresql")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--emails", type=int, default=500)
    parser.add_argument("--webhooks", type=int, default=5)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        trio.run(_run_engine, engine, args)


if __name__ == "__main__":
    main()
