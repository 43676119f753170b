"""DMARC aggregate reports mailed to dmarc@ of a served domain, through the real MX over SMTP.

Real report files in the forms the big receivers send them (tests/dmarc_reports/: Google's
zip, Microsoft's gzip, Yahoo's gzip and plain XML), dated yesterday (one Yahoo report three
weeks back), read back through `GET /v1/domains/{id}/dmarc`: counts and pass rates per
organisation and source, and the sources that are not the service, per day beside what the
service delivered of the domain's mail. A zip bomb and a gzip
bomb are refused with the memory of the process flat; mail that is no report for the
address's domain is refused, and the DNS guidance names the address.
"""

from __future__ import annotations

import gzip
import io
import re
import tracemalloc
import zipfile
import zlib
from datetime import UTC, datetime, timedelta
from typing import Any

from engine.forwarding import report_files
from tests.harness.bounce_domain import with_bounce_domain
from tests.harness.dns_server import DnsServer
from tests.harness.reports import FIXTURES, RUA, report_mail, send
from tests.harness.sending import SENDING_DOMAIN, message, route_mail, wait_for_email
from tests.harness.service import SMTP_HOST, Service
from tests.harness.smtp_sink import SmtpSink

POSTROOM_IP = "192.0.2.10"  # the service's sending address, through POSTROOM_SMTP_HOST's A
BOMB_MIB = 256  # unpacked; far past the cap (report_files.MAX_OCTETS)


def dated(name: str, day: datetime) -> bytes:
    """A fixture report with its date range moved to `day` (the report's day, UTC)."""
    begin = int(day.replace(hour=0, minute=0, second=0, microsecond=0).timestamp())
    xml = (FIXTURES / name).read_text()
    xml = re.sub(r"<begin>\d+</begin>", f"<begin>{begin}</begin>", xml)
    xml = re.sub(r"<end>\d+</end>", f"<end>{begin + 86399}</end>", xml)
    return xml.encode()


def zipped(name: str, content: bytes) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(name, content)
    return buffer.getvalue()


def google(day: datetime) -> bytes:
    name = f"google.com!{SENDING_DOMAIN}!1764115200!1764201599"
    return report_mail(
        "google.com",
        "noreply-dmarc-support@google.com",
        zipped(f"{name}.xml", dated("google.xml", day)),
        "application/zip",
        f"{name}.zip",
    )


def microsoft(day: datetime) -> bytes:
    name = f"enterprise.protection.outlook.com!{SENDING_DOMAIN}!1764115200!1764201600.xml.gz"
    content = gzip.compress(dated("microsoft.xml", day))
    return report_mail(
        "enterprise.protection.outlook.com",
        "dmarcreport@microsoft.com",
        content,
        "application/gzip",
        name,
    )


def yahoo(day: datetime, *, plain: bool = False, report_id: str | None = None) -> bytes:
    content = dated("yahoo.xml", day)
    if report_id is not None:
        content = re.sub(rb"<report_id>[^<]+", b"<report_id>" + report_id.encode(), content)
    name = f"yahoo.com!{SENDING_DOMAIN}!1764115200!1764201599.xml"
    if plain:
        return report_mail("yahoo.com", "noreply@dmarc.yahoo.com", content, "text/xml", name)
    return report_mail(
        "yahoo.com",
        "noreply@dmarc.yahoo.com",
        gzip.compress(content),
        "application/gzip",
        name + ".gz",
    )


async def ready(service: Service, dns_server: DnsServer) -> tuple[Any, dict[str, Any]]:
    account, domain = await with_bounce_domain(service, dns_server)
    dns_server.set(SMTP_HOST, "A", [POSTROOM_IP])
    return account, domain


def yesterday() -> datetime:
    return datetime.now(UTC) - timedelta(days=1)


async def test_reports_from_google_microsoft_and_yahoo_are_summed_per_source(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await ready(service, dns_server)
    dmarc = next(r for r in domain["dns_records"] if r["purpose"] == "dmarc")
    assert dmarc["value"] == f"v=DMARC1; p=none; rua=mailto:{RUA};"
    day = yesterday()
    for data in (google(day), microsoft(day), yahoo(day)):
        assert (await send(service, data))[0] == 250
    # Sent again, a report replaces its copy; a report three weeks old counts in 30d only.
    assert (await send(service, google(day)))[0] == 250
    old = yahoo(day - timedelta(days=20), plain=True, report_id="1762387200.11")
    assert (await send(service, old, [f"DMARC@{SENDING_DOMAIN.upper()}"]))[0] == 250

    path = f"/v1/domains/{domain['id']}/dmarc"
    week = (await account.client.get(path, params={"range": "7d"})).json()
    assert (week["range"], week["reports"], week["messages"]) == ("7d", 3, 181)
    assert (week["dkim_pass_rate"], week["spf_pass_rate"]) == (round(176 / 181, 4), 0.9669)
    assert week["dmarc_pass_rate"] == round(176 / 181, 4)
    rows = [
        (s["org_name"], s["source_ip"], s["messages"], s["dmarc_pass_rate"], s["postroom"])
        for s in week["sources"]
    ]
    assert rows == [
        ("google.com", POSTROOM_IP, 120, 1.0, True),
        ("Enterprise Outlook", POSTROOM_IP, 40, 1.0, True),
        ("Yahoo", POSTROOM_IP, 15, 1.0, True),
        ("google.com", "203.0.113.7", 3, 0.0, False),
        ("Enterprise Outlook", "2001:db8::25", 2, 0.0, False),
        ("Yahoo", "198.51.100.23", 1, 1.0, False),
    ]
    forwarded = week["sources"][-1]
    assert (forwarded["dkim_pass_rate"], forwarded["spf_pass_rate"]) == (1.0, 0.0)
    others = [(o["source_ip"], o["messages"], o["org_names"]) for o in week["other_sources"]]
    assert others == [
        ("203.0.113.7", 3, ["google.com"]),
        ("2001:db8::25", 2, ["Enterprise Outlook"]),
        ("198.51.100.23", 1, ["Yahoo"]),
    ]
    month = (await account.client.get(path, params={"range": "30d"})).json()
    assert (month["reports"], month["messages"]) == (4, 197)
    # Older than the longest range (90 days): taken, but not kept.
    ancient = yahoo(day - timedelta(days=100), report_id="1755561600.7")
    assert (await send(service, ancient))[0] == 250
    quarter = (await account.client.get(path, params={"range": "90d"})).json()
    assert (quarter["reports"], quarter["messages"]) == (4, 197)
    default = (await account.client.get(path)).json()
    assert (default["range"], default["messages"]) == ("7d", 181)


async def test_other_sources_are_joined_with_what_the_service_delivered_each_day(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await ready(service, dns_server)
    route_mail(dns_server, "customer.example")
    sent = []
    for n in range(3):  # the service delivers three of the domain's messages today
        email = await account.client.post("/v1/emails/", json=message(f"u{n}@customer.example"))
        sent.append(email.json()["id"])
    for email_id in sent:
        await wait_for_email(account, email_id, lambda e: e["status"] == "delivered")
    today, day_before = datetime.now(UTC), yesterday()
    assert (await send(service, google(today)))[0] == 250
    assert (await send(service, yahoo(day_before)))[0] == 250

    path = f"/v1/domains/{domain['id']}/dmarc"
    week = (await account.client.get(path, params={"range": "7d"})).json()
    rows = [
        (d["day"], d["source_ip"], d["postroom"], d["messages"], d["service_delivered"])
        for d in week["by_day"]
    ]
    assert rows == [
        (day_before.date().isoformat(), POSTROOM_IP, True, 15, 0),
        (day_before.date().isoformat(), "198.51.100.23", False, 1, 0),
        (today.date().isoformat(), POSTROOM_IP, True, 120, 3),
        (today.date().isoformat(), "203.0.113.7", False, 3, 3),
    ]
    others = {o["source_ip"]: o["while_service_idle"] for o in week["other_sources"]}
    # Yahoo saw 198.51.100.23 send as the domain on a day the service sent none of its mail.
    assert others == {"203.0.113.7": 0, "198.51.100.23": 1}


async def test_the_dmarc_summary_is_scoped_and_its_query_checked(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await ready(service, dns_server)
    three_days_ago = datetime.now(UTC) - timedelta(days=3)
    sent = await send(service, google(three_days_ago))
    assert sent[0] == 250, sent
    path = f"/v1/domains/{domain['id']}/dmarc"
    for params in ({"range": "1y"}, {"range": "7d", "limit": "5"}):
        refused = await account.client.get(path, params=params)
        assert refused.status_code == 422, refused.text
    other = await service.account("starter")
    assert (await other.client.get(path)).status_code == 404
    # 24h counts the reports of yesterday and today: none here, and no rate to give.
    day = (await account.client.get(path, params={"range": "24h"})).json()
    assert (day["reports"], day["messages"], day["sources"]) == (0, 0, [])
    assert (day["dkim_pass_rate"], day["dmarc_pass_rate"]) == (None, None)
    week = (await account.client.get(path, params={"range": "7d"})).json()
    assert (week["reports"], week["messages"]) == (1, 123)


async def test_what_is_no_report_for_the_addresses_domain_is_refused(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await ready(service, dns_server)
    # An address of a domain not served is refused at RCPT.
    code, _ = await send(service, google(yesterday()), ["dmarc@not-served.example"])
    assert code == 550
    # A report about another domain, mail with no report, a report that is not XML.
    elsewhere = dated("google.xml", yesterday()).replace(
        b"<domain>mail.example.org</domain>", b"<domain>other.example</domain>"
    )
    cases = {
        "other.example": report_mail("g", "a@g.example", elsewhere, "text/xml", "r.xml"),
        "carries no DMARC": report_mail("g", "a@g.example", b"hello", "text/plain", "r.txt"),
        "not XML": report_mail("g", "a@g.example", b"<?xml version='1.0'?><a", "text/xml", "x.xml"),
    }
    for expected, data in cases.items():
        code, reply = await send(service, data)
        assert (code, expected in reply) == (550, True), reply
    # An entity expansion (billion laughs) is refused by the hardened parser, not expanded.
    laughs = (
        b'<?xml version="1.0"?><!DOCTYPE f [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><feedback>&b;</feedback>'
    )
    code, _ = await send(service, report_mail("g", "a@g.example", laughs, "text/xml", "l.xml"))
    assert code == 550
    body = (await account.client.get(f"/v1/domains/{domain['id']}/dmarc")).json()
    assert body["reports"] == 0


def _zeros(mib: int) -> bytes:
    """`mib` MiB of zeros, deflated a MiB at a time (never held unpacked)."""
    deflater = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    chunk = b"\0" * (1024 * 1024)
    return b"".join(deflater.compress(chunk) for _ in range(mib)) + deflater.flush()


def _zip_of_zeros(mib: int) -> bytes:
    buffer = io.BytesIO()
    chunk = b"\0" * (1024 * 1024)
    with (
        zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive,
        archive.open("report.xml", "w", force_zip64=True) as member,
    ):
        for _ in range(mib):
            member.write(chunk)
    return buffer.getvalue()


async def test_a_zip_bomb_and_a_gzip_bomb_are_refused_with_flat_memory(
    service: Service, dns_server: DnsServer
) -> None:
    await ready(service, dns_server)
    bombs = {
        "zip": report_mail("g", "a@g.example", _zip_of_zeros(BOMB_MIB), "application/zip", "b.zip"),
        "gzip": report_mail("m", "a@m.example", _zeros(BOMB_MIB), "application/gzip", "b.xml.gz"),
    }
    cap_mib = report_files.MAX_OCTETS // (1024 * 1024)
    for kind, data in bombs.items():
        assert len(data) < 1024 * 1024  # under a MiB mailed, 256 MiB unpacked
        tracemalloc.start()
        try:
            code, reply = await send(service, data)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert (code, "refused" in reply) == (552, True), (kind, reply)
        # Never more than the cap (and its one copy) held: far from the bomb's 256 MiB.
        assert peak < 3 * cap_mib * 1024 * 1024, (kind, peak)
