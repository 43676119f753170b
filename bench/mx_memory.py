"""Memory under large inbound mail: `python bench/mx_memory.py [--engines sqlite,postgresql]
[--messages 8] [--mib 34]`.

Starts `postroom serve` as shipped (its workers included) with a verified domain and a
forward from `support@` to a mailbox on the loopback sink, then sends `--messages` messages
of `--mib` MiB each to the forward, all at once, to the inbound MX (no authentication, as a
stranger would) and reports the service's resident memory, summed over serve and its
workers: before, the highest seen while the messages are taken, forwarded and delivered
(sampled), and `--settle` seconds after the last one reached the sink, in all and per
process (serve, the intake and the delivery workers). Prints, never asserts;
tests/test_mx_memory.py asserts the target on the same figures.
"""

from __future__ import annotations

import base64
import itertools
import os
import smtplib
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.api_throughput import _free_port
from bench.peers import (
    bench_parser,
    loopback_mail,
    memory_mib,
    postroom_process,
    until_healthy,
    verified_domain,
)
from bench.wrk import process_tree

DOMAIN = "in.example.org"
SOURCE = f"support@{DOMAIN}"
DESTINATION = "me@dest.example"  # bench.peers routes dest.example to the sink


def big_message(mib: int) -> bytes:
    """A message of about `mib` MiB: a short text and one attachment, base64 in 76-column
    lines, CRLF line ends, as a mail client writes it."""
    raw = os.urandom(mib * 1024 * 1024 * 3 // 4)
    encoded = base64.encodebytes(raw).replace(b"\n", b"\r\n")
    head = (
        f"From: Alice <alice@sender.example>\r\nTo: {SOURCE}\r\nSubject: A large file\r\n"
        "MIME-Version: 1.0\r\nContent-Type: multipart/mixed; boundary=frontier\r\n\r\n"
        "--frontier\r\nContent-Type: text/plain\r\n\r\nThe file is attached.\r\n"
        "--frontier\r\nContent-Type: application/octet-stream\r\n"
        "Content-Transfer-Encoding: base64\r\n"
        'Content-Disposition: attachment; filename="big.bin"\r\n\r\n'
    ).encode()
    return head + encoded + b"--frontier--\r\n"


def _by_process(pid: int) -> dict[str, float]:
    """Resident MiB of `pid` and each of its workers, named by role (the parent "serve")."""
    found: dict[str, float] = {}
    for member in process_tree(pid):
        try:
            words = Path(f"/proc/{member}/cmdline").read_bytes().split(b"\0")
            status = Path(f"/proc/{member}/status").read_text()
        except OSError:
            continue  # ended meanwhile
        role = "serve"
        for flag, value in itertools.pairwise(words):
            if flag == b"--role":
                role = value.decode()
        rss = next((line for line in status.splitlines() if line.startswith("VmRSS:")), None)
        if rss is None:
            continue  # ending: a zombie's status has no memory lines
        name = role if role not in found else f"{role}.{member}"
        found[name] = int(rss.split()[1]) / 1024
    return found


def _send(address: tuple[str, int], data: bytes) -> str:
    """Send one message to the MX (blocking: run in a thread); the final reply."""
    try:
        with smtplib.SMTP(*address, timeout=300) as client:
            client.sendmail("alice@sender.example", [SOURCE], data)
        return "250"
    except smtplib.SMTPException as error:
        return str(error)


async def _prepare(api: httpx.AsyncClient, dns_server: Any) -> None:
    """A verified domain with a forward from SOURCE to DESTINATION."""
    domain_id = await verified_domain(api, dns_server, DOMAIN)
    dns_server.set(DOMAIN, "MX", ["10 localhost."])  # the service's POSTROOM_SMTP_HOST
    forward = {
        "source_email": SOURCE,
        "domain_id": domain_id,
        "destination_emails": [DESTINATION],
    }
    created = await api.post("/v1/forwards/", json=forward)
    assert created.status_code == 201, created.text


async def measure(
    engine: str, messages: int = 8, mib: int = 34, settle: float = 10.0
) -> dict[str, Any]:
    """The figures of one run (MiB, seconds, the MX's replies)."""
    data = big_message(mib)
    inbound = ("127.0.0.1", _free_port())
    async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, sink):
        sink.max_message_size = 2 * len(data)  # the forwarded copies are as large
        async with postroom_process(
            engine,
            dns_servers=dns_server.nameserver,
            delivery_port=str(sink.port),
            inbound_listen=f"{inbound[0]}:{inbound[1]}",
        ) as service:
            headers = {"Authorization": f"Bearer {service.key}"}
            async with httpx.AsyncClient(base_url=service.url, headers=headers) as api:
                await until_healthy(api)
                await _prepare(api, dns_server)
            await trio.sleep(1)  # let start-up's own allocations settle
            before = memory_mib(service.pid)["VmRSS"]
            before_each = _by_process(service.pid)
            peak = before
            peak_each = dict(before_each)

            def sample() -> float:
                for name, mib in _by_process(service.pid).items():
                    peak_each[name] = max(peak_each.get(name, 0.0), mib)
                return float(memory_mib(service.pid)["VmRSS"])

            replies: list[str] = []
            started = time.perf_counter()

            async def send() -> None:
                replies.append(await trio.to_thread.run_sync(_send, inbound, data))

            async with trio.open_nursery() as senders:
                for _ in range(messages):
                    senders.start_soon(send)
                while len(replies) < messages or len(sink.messages) < replies.count("250"):
                    peak = max(peak, sample())
                    await trio.sleep(0.1)
            taken = time.perf_counter() - started
            for _ in range(int(settle * 10)):
                peak = max(peak, sample())
                await trio.sleep(0.1)
            after = memory_mib(service.pid)["VmRSS"]
            after_each = _by_process(service.pid)
        nursery.cancel_scope.cancel()
    return {
        "engine": engine,
        "messages": messages,
        "mib": mib,
        "replies": replies,
        "delivered": len(sink.messages),
        "seconds": taken,
        "before_mib": before,
        "peak_mib": peak,
        "after_mib": after,
        "processes": {
            name: (before_each.get(name, 0.0), peak_each.get(name, mib), mib)
            for name, mib in after_each.items()
        },
    }


def main() -> None:
    parser = bench_parser(__doc__)
    parser.add_argument("--messages", type=int, default=8)
    parser.add_argument("--mib", type=int, default=34)
    parser.add_argument("--settle", type=float, default=10.0)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        r = trio.run(measure, engine, args.messages, args.mib, args.settle)
        accepted = r["replies"].count("250")
        print(
            f"{engine:<11} {r['messages']} x {r['mib']} MiB to the MX at once: {accepted}"
            f" accepted, {r['delivered']} forwarded to the sink in {r['seconds']:.1f} s;"
            f" RSS {r['before_mib']:.0f} MiB before, peak {r['peak_mib']:.0f} MiB"
            f" (+{r['peak_mib'] - r['before_mib']:.0f}), {r['after_mib']:.0f} MiB"
            f" {args.settle:.0f} s after (+{r['after_mib'] - r['before_mib']:.0f})",
            flush=True,
        )
        each = ", ".join(f"{n} {b:.0f}/{p:.0f}/{a:.0f}" for n, (b, p, a) in r["processes"].items())
        print(f"            by process, MiB before/peak/after: {each}", flush=True)
        refused = sorted({reply for reply in r["replies"] if reply != "250"})
        if refused:
            print(f"            refused: {refused}", flush=True)


if __name__ == "__main__":
    main()
