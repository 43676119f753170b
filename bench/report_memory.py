"""Memory under hostile DMARC reports: `python bench/report_memory.py [--engines sqlite]
[--bomb-mib 10] [--xml-mib 100]`.

Starts `postroom serve` as shipped with a verified domain, then mails to its `dmarc@`, at the
inbound MX (no authentication, as a stranger would), one after the other:
- a zip bomb of `--bomb-mib` MiB (one member of zeros inflating to a thousand times that),
  twice: its header declaring 4 GiB, then lying (1 KiB),
- a `--xml-mib` MiB aggregate report (real records, repeated) gzip'd, as Microsoft and Yahoo
  send them,
- the same report as plain XML.
Each is refused (552: it unpacks past engine/forwarding/report_files.py's MAX_OCTETS, or
the message is over the MX's size limit), and the service's resident memory (summed over
`serve` and its workers) is printed before, at its highest while the mail is taken (sampled),
and `--settle` seconds after. Prints, never asserts; a run takes well under a minute.
"""

from __future__ import annotations

import gzip
import io
import smtplib
import struct
import sys
import time
import zipfile
import zlib
from email.message import EmailMessage
from email.policy import SMTP
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

DOMAIN = "reports.example.org"
RUA = f"dmarc@{DOMAIN}"
FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "dmarc_reports" / "google.xml"
_MIB = 1024 * 1024


def _deflated_zeros(mib: int) -> tuple[bytes, int]:
    """A raw deflate stream of zeros about `mib` MiB long, and how much it inflates to: one
    block of zeros deflated after a full flush comes out the same every time, so it is made
    once and repeated (building 10 GiB of zeros would take minutes)."""
    chunk = b"\0" * (64 * _MIB)
    deflater = zlib.compressobj(9, zlib.DEFLATED, -zlib.MAX_WBITS)
    block = deflater.compress(chunk) + deflater.flush(zlib.Z_FULL_FLUSH)
    count = max(1, mib * _MIB // len(block))
    return block * count + b"\x03\x00", count * len(chunk)  # the last, empty block


def zip_bomb(mib: int, declared: int) -> tuple[bytes, int]:
    """A zip of one member, `mib` MiB deflated, whose header says it inflates to `declared`
    octets (at most 4 GiB: no zip64 needed); and what it really inflates to."""
    data, inflated = _deflated_zeros(mib)
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("report.xml", data)  # stored: sizes are the deflated length
    raw = bytearray(buffer.getvalue())
    # Say it is deflated (method 8) and inflates to `declared`, in the local header (at
    # 0) and the central directory entry (located by the end record).
    central = struct.unpack_from("<I", raw, len(raw) - 22 + 16)[0]
    for header, method, size in ((0, 8, 22), (central, 10, 24)):
        struct.pack_into("<H", raw, header + method, 8)
        struct.pack_into("<I", raw, header + size, declared)
    return bytes(raw), inflated


def big_report(mib: int) -> bytes:
    """An aggregate report of about `mib` MiB: the fixture's records repeated."""
    xml = FIXTURE.read_text()
    start, end = xml.index("<record>"), xml.rindex("</record>") + len("</record>")
    records = xml[start:end]
    times = max(1, mib * _MIB // len(records))
    return (xml[:start] + records * times + xml[end:]).encode()


def report_mail(attachment: bytes, kind: str, filename: str) -> bytes:
    message = EmailMessage(policy=SMTP)
    message["From"] = "noreply-dmarc-support@google.com"
    message["To"] = RUA
    message["Subject"] = f"Report domain: {DOMAIN} Submitter: google.com Report-ID: 1"
    message.set_content("This is an aggregate report.")
    maintype, subtype = kind.split("/")
    message.add_attachment(attachment, maintype=maintype, subtype=subtype, filename=filename)
    return message.as_bytes()


def _send(address: tuple[str, int], data: bytes) -> str:
    """One message to the MX (blocking: run in a thread); the final reply."""
    try:
        with smtplib.SMTP(*address, timeout=300) as client:
            client.sendmail("", [RUA], data)
        return "250"
    except smtplib.SMTPResponseException as error:
        text = error.smtp_error
        said = text.decode(errors="replace") if isinstance(text, bytes) else text
        return f"{error.smtp_code} {said[:70]}"
    except (smtplib.SMTPException, OSError) as error:
        return str(error)[:80]


async def measure(engine: str, bomb_mib: int, xml_mib: int, settle: float) -> list[dict[str, Any]]:
    bomb, inflated = zip_bomb(bomb_mib, 2**32 - 1)
    liar, _ = zip_bomb(bomb_mib, 1024)
    report = big_report(xml_mib)
    bombed = f"zip bomb {len(bomb) / _MIB:.0f} MiB -> {inflated / 2**30:.0f} GiB"
    cases = [
        (f"{bombed}, says 4 GiB", bomb, "zip"),
        (f"{bombed}, says 1 KiB", liar, "zip"),
        (
            f"XML report {len(report) / _MIB:.0f} MiB, gzip'd",
            gzip.compress(report, 6),
            "gzip",
        ),
        (f"XML report {len(report) / _MIB:.0f} MiB, plain", report, "xml"),
    ]
    kinds = {
        "zip": ("application/zip", "google.com!r!1!2.zip"),
        "gzip": ("application/gzip", "r.xml.gz"),
        "xml": ("text/xml", "r.xml"),
    }
    inbound = ("127.0.0.1", _free_port())
    results = []
    async with trio.open_nursery() as nursery, loopback_mail(nursery) as (dns_server, _):
        async with postroom_process(
            engine, dns_servers=dns_server.nameserver, inbound_listen=f"{inbound[0]}:{inbound[1]}"
        ) as service:
            headers = {"Authorization": f"Bearer {service.key}"}
            async with httpx.AsyncClient(base_url=service.url, headers=headers) as api:
                await until_healthy(api)
                await verified_domain(api, dns_server, DOMAIN)
            await trio.sleep(1)
            for name, attachment, kind in cases:
                data = report_mail(attachment, *kinds[kind])
                before = memory_mib(service.pid)["VmRSS"]
                peak = before
                started = time.perf_counter()
                reply: list[str] = []

                async def send(data: bytes = data, reply: list[str] = reply) -> None:
                    reply.append(await trio.to_thread.run_sync(_send, inbound, data))

                async with trio.open_nursery() as senders:
                    senders.start_soon(send)
                    while not reply:
                        peak = max(peak, memory_mib(service.pid)["VmRSS"])
                        await trio.sleep(0.05)
                taken = time.perf_counter() - started
                for _ in range(int(settle * 20)):
                    peak = max(peak, memory_mib(service.pid)["VmRSS"])
                    await trio.sleep(0.05)
                after = memory_mib(service.pid)["VmRSS"]
                results.append(
                    {
                        "case": name,
                        "mailed_mib": len(data) / _MIB,
                        "reply": reply[0],
                        "seconds": taken,
                        "before": before,
                        "peak": peak,
                        "after": after,
                    }
                )
        nursery.cancel_scope.cancel()
    return results


def main() -> None:
    parser = bench_parser(__doc__)
    parser.set_defaults(engines="sqlite")
    parser.add_argument("--bomb-mib", type=int, default=10)
    parser.add_argument("--xml-mib", type=int, default=100)
    parser.add_argument("--settle", type=float, default=2.0)
    args = parser.parse_args()
    for engine in args.engines.split(","):
        for r in trio.run(measure, engine, args.bomb_mib, args.xml_mib, args.settle):
            print(
                f"{engine:<11} {r['case']:<40} mailed {r['mailed_mib']:6.1f} MiB:"
                f" {r['reply']!r} in {r['seconds']:.1f} s; RSS {r['before']:.0f} MiB before,"
                f" peak {r['peak']:.0f} (+{r['peak'] - r['before']:.0f}),"
                f" {r['after']:.0f} after (+{r['after'] - r['before']:.0f})",
                flush=True,
            )


if __name__ == "__main__":
    main()
