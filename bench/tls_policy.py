"""What a TLS policy costs on the delivery path: `python bench/tls_policy.py [--runs 3]
[--count 2000] [--engines sqlite]`.

The same delivery as `bench/delivery.py --delivery-cpu` (emails accepted ahead, then timed
from when they fall due until the sink has them all, with the CPU time of every process of
the service), three times over, to a sink that offers STARTTLS with a certificate from a test
CA for its MX name:

- opportunistic: no policy (STARTTLS, nothing verified);
- mta-sts: the recipient domain publishes an MTA-STS policy in `enforce` mode, fetched over
  HTTPS from a loopback policy server (once: it is cached, as every round after the first
  finds it), and each session's certificate is verified for the MX name;
- dane: with POSTROOM_DNSSEC=on, the DNS server answers the MX and its TLSA record (DANE-EE,
  SPKI SHA-256) as authenticated, and each session's certificate is matched to it.

Prints emails/s and CPU ms per email per mode and each mode's rate as a ratio to the
opportunistic one (issue 31: with the policy cached, within 5%). Each run's delivered events
are checked for the policy the mode applies. Prints, never asserts.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import httpx
import trio
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.delivery import delivery_cpu
from bench.peers import RECIPIENT_DOMAIN, bench_parser
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority, make_authority

MX = f"mx.{RECIPIENT_DOMAIN}"
MODES = ("opportunistic", "mta-sts", "dane")


def _spki_sha256(pem: bytes) -> str:
    key = x509.load_pem_x509_certificate(pem).public_key()
    der = key.public_bytes(Encoding.DER, PublicFormat.SubjectPublicKeyInfo)
    return hashlib.sha256(der).hexdigest()


def _peers(mode: str, ca: TlsAuthority, policy_server: HttpsReceiver) -> Any:
    """The DNS server and a STARTTLS sink for RECIPIENT_DOMAIN, published for `mode`."""

    @asynccontextmanager
    async def peers(nursery: trio.Nursery) -> AsyncIterator[tuple[DnsServer, SmtpSink]]:
        context = ca.server_context()
        leaf = ca.ca.issue_cert(MX)
        leaf.configure_cert(context)
        dns_server, sink = DnsServer(), SmtpSink(context)
        await nursery.start(dns_server.run)
        await nursery.start(sink.run)
        dns_server.set(RECIPIENT_DOMAIN, "MX", [f"10 {MX}."])
        dns_server.set(MX, "A", ["127.0.0.1"])
        if mode == "mta-sts":
            dns_server.set(f"_mta-sts.{RECIPIENT_DOMAIN}", "TXT", ["v=STSv1; id=bench1"])
            dns_server.set(f"mta-sts.{RECIPIENT_DOMAIN}", "A", ["127.0.0.1"])
            policy = f"version: STSv1\r\nmode: enforce\r\nmx: {MX}\r\nmax_age: 86400\r\n"
            policy_server.respond(200, policy)
        elif mode == "dane":
            tlsa = f"_{sink.port}._tcp.{MX}"  # looked up at the port delivery dials
            dns_server.set(tlsa, "TLSA", [f"3 1 1 {_spki_sha256(leaf.cert_chain_pems[0].bytes())}"])
            dns_server.secure(RECIPIENT_DOMAIN, tlsa)
        yield dns_server, sink

    return peers


def _applied(mode: str) -> Any:
    async def check(api: httpx.AsyncClient) -> None:
        [first] = (await api.get("/v1/emails/", params={"limit": 1})).json()
        email = (await api.get(f"/v1/emails/{first['id']}")).json()
        [delivered] = [e for e in email["events"] if e["event_type"] == "delivered"]
        policy = delivered["metadata"]["policy"]
        if policy != mode:
            print(f"  !! {mode}: the delivered event says policy {policy}", flush=True)

    return check


async def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--count", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        ca = make_authority(Path(tmp))
        for engine in args.engines.split(","):
            figures: dict[str, dict[str, Any]] = {}
            async with trio.open_nursery() as nursery:
                context = ca.server_context()
                ca.ca.issue_cert(f"mta-sts.{RECIPIENT_DOMAIN}").configure_cert(context)
                policy_server = HttpsReceiver(context)
                await nursery.start(policy_server.run)
                for mode in MODES:
                    settings = {
                        "mta_sts_port": str(policy_server.port),
                        "extra_ca_file": str(ca.ca_file),
                        "dnssec": "on" if mode == "dane" else "off",
                    }
                    figures[mode] = await delivery_cpu(
                        engine,
                        args.runs,
                        args.count,
                        peers=_peers(mode, ca, policy_server),
                        after=_applied(mode),
                        settings=settings,
                    )
                nursery.cancel_scope.cancel()
            base = figures["opportunistic"]["delivered_per_s"]
            for mode, found in figures.items():
                print(
                    f"{engine:<10}  {mode:<13} {found['delivered_per_s']:7.0f} emails/s"
                    f"  {found['cpu_ms_per_email']:5.2f} CPU ms per email"
                    f"  {found['delivered_per_s'] / base:5.2f}x opportunistic",
                    flush=True,
                )


if __name__ == "__main__":
    trio.run(main)
