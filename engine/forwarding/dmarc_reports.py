"""DMARC aggregate reports (RFC 7489 section 7.2 and appendix C) mailed to the service, and
what they say about a domain's mail.

The DNS guidance (engine/domains/registry.py) puts `rua=mailto:dmarc@<bounce domain>` in a
domain's DMARC record (the domain itself when it has no bounce domain): both are of the same
organisational domain, so receivers need no external-destination record. The inbound MX
accepts `dmarc@` of every served domain (a verified sending domain or its bounce domain, as
for postmaster@: engine/forwarding/postmaster.py). Its hook (engine/forwarding/inbound.py):
`accepts` at RCPT, `read` before the message's unit of work, `store` inside it.

A report comes as an attachment (or the body): zip (Google), gzip (Microsoft, Yahoo) or plain
XML (Yahoo). Unpacking is bounded: compressed data is inflated a chunk at a time and refused
(552) once it passes `MAX_XML_OCTETS`, so a zip or gzip bomb never lands in memory whole; a
zip may hold at most `MAX_ZIP_MEMBERS` files. The XML is parsed by defusedxml (no entities,
no external references). A report about a domain the address does not serve, or one that is
no report, is refused (550) so its sender learns at once; a report sent again replaces the
copy stored before, and a domain keeps the reports of its last `KEPT_DAYS` days
(storage/dmarc_reports.py).
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import ipaddress
import zipfile
import zlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from email.message import EmailMessage
from typing import IO
from xml.etree.ElementTree import Element

import defusedxml.ElementTree
from defusedxml import DefusedXmlException

from engine.domains.spf import sending_addresses
from engine.errors import InvalidRequest, NotFound, PayloadTooLarge
from engine.forwarding import postmaster
from engine.runtime import Principal, Runtime
from storage import dmarc_reports, domains
from storage.dmarc_reports import Record
from storage.tx import Tx

LOCAL_PART = "dmarc"
MAX_XML_OCTETS = 16 * 1024 * 1024  # of one report, unpacked (a large sender's day: a few MB)
MAX_ZIP_MEMBERS = 4
MAX_RECORDS = 50_000  # rows of one report
_CHUNK = 64 * 1024
_TEXT = 255  # characters kept of a text field
_MAX_COUNT = 2**53  # messages in one row: more is no real report
# Days before today a range reaches back: a report covers a whole UTC day and arrives the
# day after, so `24h` holds yesterday's reports (and any of today's).
RANGES = {"24h": 1, "7d": 7, "30d": 30, "90d": 90}
KEPT_DAYS = max(RANGES.values())  # a domain's reports of older days are deleted
_ZIP_TYPES = frozenset({"application/zip", "application/x-zip-compressed", "application/x-zip"})
_GZIP_TYPES = frozenset({"application/gzip", "application/x-gzip", "application/gzip-compressed"})
_XML_TYPES = frozenset({"text/xml", "application/xml"})


def report_domain(address: str) -> str | None:
    """The domain of a dmarc@ address (lower case), else None."""
    local, at, domain = address.strip().removeprefix("<").removesuffix(">").rpartition("@")
    if not at or local.lower() != LOCAL_PART or not domain:
        return None
    return domain.lower().rstrip(".")


async def accepts(rt: Runtime, address: str) -> bool | None:
    """Whether a dmarc@ address is of a served domain; None when it is no dmarc@ address."""
    domain = report_domain(address)
    if domain is None:
        return None
    return bool(await rt.db.read(domains.verified_serving, [domain]))


@dataclass(frozen=True, slots=True)
class Report:
    policy_domain: str  # the domain the report is about (its `policy_published`)
    records: tuple[Record, ...]


@dataclass(frozen=True, slots=True)
class Arrival:
    recipients: tuple[str, ...]  # its dmarc@ addresses
    reports: tuple[Report, ...]


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"a DMARC report unpacks to more than {MAX_XML_OCTETS // (1024 * 1024)} MiB: refused"
    )


def _capped(chunks: Iterator[bytes]) -> bytes:
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if len(out) > MAX_XML_OCTETS:
            raise _too_large()
    return bytes(out)


def _gunzip_chunks(data: bytes) -> Iterator[bytes]:
    inflater = zlib.decompressobj(wbits=16 + zlib.MAX_WBITS)  # gzip framing
    pending = data
    try:
        while not inflater.eof:
            chunk = inflater.decompress(pending, _CHUNK)
            pending = inflater.unconsumed_tail
            if not chunk and not pending:
                raise InvalidRequest("the gzip'd DMARC report is cut short")
            yield chunk
    except zlib.error as error:
        raise InvalidRequest(f"the gzip'd DMARC report is damaged: {error}") from None


def _read_chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(_CHUNK):
        yield chunk


def _unzip(data: bytes) -> list[bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if not members or len(members) > MAX_ZIP_MEMBERS:
                raise InvalidRequest(
                    f"a zipped DMARC report holds 1 to {MAX_ZIP_MEMBERS} files, not {len(members)}"
                )
            unpacked = []
            for member in members:
                if member.file_size > MAX_XML_OCTETS:  # declared: refused before inflating
                    raise _too_large()
                with archive.open(member) as stream:  # the declared size may lie: capped
                    unpacked.append(_capped(_read_chunks(stream)))
            return unpacked
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as error:
        raise InvalidRequest(f"the zipped DMARC report is damaged: {error}") from None


def _documents(message: EmailMessage) -> list[bytes]:
    """The XML documents a message carries, unpacked: each zip, gzip or XML part."""
    found: list[bytes] = []
    for part in message.walk():
        if part.is_multipart():
            continue
        payload = part.get_payload(decode=True)
        if not isinstance(payload, bytes):
            continue
        kind = part.get_content_type()
        name = (part.get_filename() or "").lower()
        if payload.startswith(b"PK\x03\x04") or kind in _ZIP_TYPES or name.endswith(".zip"):
            found.extend(_unzip(payload))
        elif payload.startswith(b"\x1f\x8b") or kind in _GZIP_TYPES or name.endswith(".gz"):
            found.append(_capped(_gunzip_chunks(payload)))
        elif kind in _XML_TYPES or name.endswith(".xml") or payload.lstrip().startswith(b"<?xml"):
            if len(payload) > MAX_XML_OCTETS:
                raise _too_large()
            found.append(payload)
    return found


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
    addressed = tuple(r for r in recipients if report_domain(r) is not None)
    if not addressed:
        return None
    message = email.parser.BytesParser(policy=email.policy.default).parsebytes(data)
    assert isinstance(message, EmailMessage)  # the default policy's message class
    documents = _documents(message)
    if not documents:
        raise InvalidRequest("the message carries no DMARC aggregate report (zip, gzip or XML)")
    return Arrival(addressed, tuple(parse(d) for d in documents))


def _about(report: Report, domain_name: str) -> bool:
    name = report.policy_domain
    return name == domain_name or name.endswith("." + domain_name)


def store(tx: Tx, arrival: Arrival, forwarded: Collection[str], now: datetime) -> None:
    """Store each report for the domain it is about, owned by the workspace whose served
    domain it was sent to; in the caller's transaction. InvalidRequest when a report is
    about no domain its address serves."""
    stored: set[int] = set()
    kept_since = now.astimezone(UTC).date() - timedelta(days=KEPT_DAYS)
    for recipient in arrival.recipients:
        if recipient in forwarded:
            stored.update(range(len(arrival.reports)))  # a forward took it: not ours to read
            continue
        for owner in postmaster.owners(tx, report_domain(recipient) or ""):
            for index, report in enumerate(arrival.reports):
                if _about(report, owner.name):
                    dmarc_reports.replace(
                        tx, owner.workspace_id, owner.id, report.records, kept_since, now
                    )
                    stored.add(index)
    missed = sorted({r.policy_domain for i, r in enumerate(arrival.reports) if i not in stored})
    if missed:
        raise InvalidRequest(
            f"the DMARC report is about {', '.join(missed)}, a domain this address does not serve"
        )


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
class Summary:
    range: str
    first_day: date
    reports: int
    sources: list[Source]  # most messages first


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
    """The reports received for one of the workspace's domains over a range (`RANGES`),
    by organisation and source address; NotFound for another's domain."""
    if await rt.db.read(domains.get, who.workspace_id, domain_id) is None:
        raise NotFound("domain not found")
    first_day = rt.clock.now().astimezone(UTC).date() - timedelta(days=RANGES[range_name])
    records = await rt.db.read(dmarc_reports.since, who.workspace_id, domain_id, first_day)
    reports = len({(r.org_name, r.report_id) for r in records})
    sources = summarise(records, await _our_addresses(rt))
    return Summary(range_name, first_day, reports, sources)
