"""DMARC aggregate reports (RFC 7489 section 7.2 and appendix C) mailed to the service, and
what they say about a domain's mail.

The DNS guidance (engine/domains/registry.py) puts `rua=mailto:dmarc@<bounce domain>` in a
domain's DMARC record (the domain itself when it has no bounce domain): both are of the same
organisational domain, so receivers need no external-destination record. The inbound MX
accepts `dmarc@` of every served domain (a verified sending domain or its bounce domain, as
for postmaster@: engine/forwarding/postmaster.py). Its hook (engine/forwarding/inbound.py):
`accepts` at RCPT, `read` before the message's unit of work, `store` inside it.

A report comes as an attachment (or the body): zip (Google), gzip (Microsoft, Yahoo) or plain
XML (Yahoo), unpacked with hard limits (engine/forwarding/report_files.py: a zip or gzip
bomb is refused, never inflated whole). The XML is parsed by defusedxml (no entities,
no external references). A report about a domain the address does not serve, or one that is
no report, is refused (550) so its sender learns at once; a report sent again replaces the
copy stored before, and a domain keeps the reports of its last `report_files.KEPT_DAYS` days
(storage/dmarc_reports.py).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from xml.etree.ElementTree import Element

import defusedxml.ElementTree
from defusedxml import DefusedXmlException

from engine.domains import dmarc
from engine.domains.spf import sending_addresses
from engine.forwarding import report_files
from engine.platform.errors import InvalidRequest, NotFound
from engine.platform.runtime import Principal, Runtime
from storage import dmarc_reports, domains
from storage.dmarc_reports import Record
from storage.tx import Tx

ADDRESS = report_files.ReportAddress(dmarc.REPORTS_LOCAL_PART)
MAX_RECORDS = 50_000  # rows of one report
_TEXT = 255  # characters kept of a text field
_MAX_COUNT = 2**53  # messages in one row: more is no real report
_XML_TYPES = frozenset({"text/xml", "application/xml"})


@dataclass(frozen=True, slots=True)
class Report:
    policy_domain: str  # the domain the report is about (its `policy_published`)
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class Arrival:
    recipients: tuple[str, ...]  # its dmarc@ addresses
    reports: tuple[Report, ...]


def _text(element: Element | None, path: str) -> str:
    found = None if element is None else element.find(path)
    return " ".join((found.text or "").split())[:_TEXT] if found is not None else ""


def _required(element: Element, path: str) -> str:
    value = _text(element, path)
    if not value:
        raise InvalidRequest(f"the DMARC report has no {path}")
    return value


def _record(element: Element, org_name: str, report_id: str, day: date) -> Record:
    row = element.find("row")
    if row is None:
        raise InvalidRequest("a record of the DMARC report has no row")
    try:
        source_ip = ipaddress.ip_address(_required(row, "source_ip")).compressed
        count = int(_required(row, "count"))
    except ValueError as error:
        raise InvalidRequest(f"a row of the DMARC report is not understood: {error}") from None
    if not 0 <= count <= _MAX_COUNT:
        raise InvalidRequest(f"a row of the DMARC report counts {count} messages")
    return Record(
        day=day,
        org_name=org_name,
        report_id=report_id,
        source_ip=source_ip,
        message_count=count,
        header_from=_text(element, "identifiers/header_from").lower(),
        disposition=_text(row, "policy_evaluated/disposition").lower() or "none",
        dkim_pass=_text(row, "policy_evaluated/dkim").lower() == "pass",
        spf_pass=_text(row, "policy_evaluated/spf").lower() == "pass",
    )


def parse(document: bytes) -> Report:
    """One aggregate report's XML, read (InvalidRequest when it is none). Element names are
    compared without their namespace: DMARCbis reports put theirs in one."""
    try:
        root = defusedxml.ElementTree.fromstring(document)
    except (SyntaxError, DefusedXmlException, ValueError) as error:
        raise InvalidRequest(f"the DMARC report is not XML that may be read: {error}") from None
    for element in root.iter():
        if isinstance(element.tag, str):
            element.tag = element.tag.rpartition("}")[2]
    if root.tag != "feedback":
        raise InvalidRequest("the XML is no DMARC aggregate report (its root is not feedback)")
    metadata = root.find("report_metadata")
    if metadata is None:
        raise InvalidRequest("the DMARC report has no report_metadata")
    org_name = _required(metadata, "org_name")
    report_id = _required(metadata, "report_id")
    try:
        begin = int(_required(metadata, "date_range/begin"))
        day = datetime.fromtimestamp(begin, UTC).date()
    except (ValueError, OverflowError, OSError):
        raise InvalidRequest("the DMARC report's date_range/begin is not a time") from None
    policy_domain = _required(root, "policy_published/domain").lower().rstrip(".")
    elements = root.findall("record")
    if len(elements) > MAX_RECORDS:
        raise InvalidRequest(f"the DMARC report has more than {MAX_RECORDS} records")
    records = tuple(_record(e, org_name, report_id, day) for e in elements)
    return Report(policy_domain, records)


def read(recipients: Sequence[str], data: bytes) -> Arrival | None:
    """The message's dmarc@ recipients and the reports it carries, or None when it is to no
    dmarc@ address; InvalidRequest or PayloadTooLarge (the MX refuses it) when it carries
    no report that may be read. Pure: no database."""
    addressed = tuple(r for r in recipients if ADDRESS.domain(r) is not None)
    if not addressed:
        return None
    documents = report_files.documents(data, _XML_TYPES, ".xml", b"<?xml")
    if not documents:
        raise InvalidRequest("the message carries no DMARC aggregate report (zip, gzip or XML)")
    return Arrival(addressed, tuple(parse(d) for d in documents))


def store(tx: Tx, arrival: Arrival, forwarded: Collection[str], now: datetime) -> None:
    """Store each report for the domain it is about, owned by the workspace whose served
    domain it was sent to; in the caller's transaction. InvalidRequest when a report is
    about no domain its address serves."""
    kept_since = now.astimezone(UTC).date() - timedelta(days=report_files.KEPT_DAYS)
    about = [r.policy_domain for r in arrival.reports]
    for owner, mine in report_files.owned(
        tx, ADDRESS, arrival.recipients, forwarded, about, "DMARC report"
    ):
        for index in mine:
            records = arrival.reports[index].records
            dmarc_reports.replace(tx, owner.workspace_id, owner.id, records, kept_since, now)


@dataclass(frozen=True, slots=True)
class Source:
    """What one organisation reported about mail from one address."""

    org_name: str
    source_ip: str
    messages: int
    dkim_pass: int  # messages
    spf_pass: int
    dmarc_pass: int
    postroom: bool  # the address is one the service's mail leaves from


@dataclass(frozen=True, slots=True)
class SourceDay:
    """What the reports counted from one address on one day, beside what the service
    delivered of the domain's mail that day (from all its sending addresses: delivery does
    not record which one the system chose)."""

    day: date
    source_ip: str
    messages: int
    postroom: bool
    service_delivered: int


@dataclass(frozen=True, slots=True)
class Summary:
    range: str
    first_day: date
    reports: int
    sources: list[Source]  # most messages first
    days: list[SourceDay]  # by day, then most messages first


def by_day(
    records: Sequence[Record], ours: Collection[str], delivered: dict[date, int]
) -> list[SourceDay]:
    """The rows per day and source address, joined with the service's deliveries that day."""
    counted: dict[tuple[date, str], int] = {}
    for r in records:
        counted[r.day, r.source_ip] = counted.get((r.day, r.source_ip), 0) + r.message_count
    days = [
        SourceDay(day, ip, messages, ip in ours, delivered.get(day, 0))
        for (day, ip), messages in counted.items()
    ]
    return sorted(days, key=lambda d: (d.day, -d.messages, d.source_ip))


def summarise(records: Sequence[Record], ours: Collection[str]) -> list[Source]:
    """Rows grouped by organisation and source address, most messages first."""
    grouped: dict[tuple[str, str], list[Record]] = {}
    for record in records:
        grouped.setdefault((record.org_name, record.source_ip), []).append(record)
    sources = [
        Source(
            org_name=org_name,
            source_ip=ip,
            messages=sum(r.message_count for r in rows),
            dkim_pass=sum(r.message_count for r in rows if r.dkim_pass),
            spf_pass=sum(r.message_count for r in rows if r.spf_pass),
            dmarc_pass=sum(r.message_count for r in rows if r.dkim_pass or r.spf_pass),
            postroom=ip in ours,
        )
        for (org_name, ip), rows in grouped.items()
    ]
    return sorted(sources, key=lambda s: (-s.messages, s.org_name, s.source_ip))


async def _our_addresses(rt: Runtime) -> set[str]:
    found = set()
    for address in await sending_addresses(rt):
        try:
            found.add(ipaddress.ip_address(address).compressed)
        except ValueError:
            continue  # a host name in the setting: its addresses are not ours to guess
    return found


async def summary(rt: Runtime, who: Principal, domain_id: str, range_name: str) -> Summary:
    """The reports received for one of the workspace's domains over a range
    (`report_files.RANGES`), by organisation and source address; NotFound for another's
    domain."""
    if await rt.db.read(domains.get, who.workspace_id, domain_id) is None:
        raise NotFound("domain not found")
    first_day = rt.clock.now().astimezone(UTC).date() - timedelta(
        days=report_files.RANGES[range_name]
    )
    records = await rt.db.read(dmarc_reports.since, who.workspace_id, domain_id, first_day)
    delivered = await rt.db.read(
        dmarc_reports.delivered_by_day, who.workspace_id, domain_id, first_day
    )
    reports = len({(r.org_name, r.report_id) for r in records})
    ours = await _our_addresses(rt)
    sources = summarise(records, ours)
    return Summary(range_name, first_day, reports, sources, by_day(records, ours, delivered))
