"""Report files mailed to the inbound MX (DMARC aggregate reports, TLS reports): the
addresses they are sent to, and their files, found in a message's parts and unpacked with
hard limits.

Reports go to one local part (`dmarc@`, `tls-rpt@`) of every served domain: a verified
sending domain or its bounce domain, as for postmaster@ (engine/forwarding/postmaster.py).

A report comes as an attachment (or the body): zip, gzip or plain. Compressed data is
inflated a chunk at a time and refused (552) once it passes `MAX_OCTETS`, so a zip or gzip
bomb never lands in memory whole; a zip's declared sizes are checked before inflating and
may hold at most `MAX_ZIP_MEMBERS` files.
"""

from __future__ import annotations

import email.parser
import email.policy
import io
import zipfile
import zlib
from collections.abc import Collection, Iterator, Sequence
from dataclasses import dataclass
from email.message import EmailMessage
from typing import IO

from engine.forwarding import postmaster
from engine.platform.errors import InvalidRequest, PayloadTooLarge
from engine.platform.runtime import Runtime
from storage import domains
from storage.domains import Domain
from storage.tx import Tx

MAX_OCTETS = 16 * 1024 * 1024  # of one report, unpacked (a large sender's day: a few MB)
MAX_ZIP_MEMBERS = 4
_CHUNK = 64 * 1024
_ZIP_TYPES = frozenset({"application/zip", "application/x-zip-compressed", "application/x-zip"})
_GZIP_TYPES = frozenset(
    {
        "application/gzip",
        "application/x-gzip",
        "application/gzip-compressed",
        "application/tlsrpt+gzip",
    }
)


# Days before today a summary's range reaches back: a report covers a whole UTC day and
# arrives the day after, so `24h` holds yesterday's reports (and any of today's).
RANGES = {"24h": 1, "7d": 7, "30d": 30, "90d": 90}
KEPT_DAYS = max(RANGES.values())  # a domain's reports of older days are deleted


@dataclass(frozen=True, slots=True)
class ReportAddress:
    """The local part reports of one kind are sent to, on every served domain."""

    local_part: str

    def domain(self, address: str) -> str | None:
        """The domain of an address with this local part (lower case), else None."""
        local, at, domain = address.strip().removeprefix("<").removesuffix(">").rpartition("@")
        if not at or local.lower() != self.local_part or not domain:
            return None
        return domain.lower().rstrip(".")

    async def accepts(self, rt: Runtime, address: str) -> bool | None:
        """Whether an address with this local part is of a served domain; None when the
        address has another local part."""
        domain = self.domain(address)
        if domain is None:
            return None
        return bool(await rt.db.read(domains.verified_serving, [domain]))


def _about(report_domain: str, domain_name: str) -> bool:
    return report_domain == domain_name or report_domain.endswith("." + domain_name)


def owned(
    tx: Tx,
    address: ReportAddress,
    recipients: Sequence[str],
    forwarded: Collection[str],
    about: Sequence[str],
    what: str,
) -> list[tuple[Domain, list[int]]]:
    """Who keeps what a message holds: for each recipient a forward did not take, each
    domain it serves and the indexes of the items (`about`: the domain each is about) that
    are about that domain or a subdomain of it. InvalidRequest (the MX refuses the message)
    when an item is about no domain its address serves."""
    owners: list[tuple[Domain, list[int]]] = []
    placed: set[int] = set()
    for recipient in recipients:
        if recipient in forwarded:
            placed.update(range(len(about)))  # a forward took it: not ours to read
            continue
        for owner in postmaster.owners(tx, address.domain(recipient) or ""):
            mine = [i for i, name in enumerate(about) if _about(name, owner.name)]
            owners.append((owner, mine))
            placed.update(mine)
    missed = sorted({name for i, name in enumerate(about) if i not in placed})
    if missed:
        raise InvalidRequest(
            f"the {what} is about {', '.join(missed)}, a domain this address does not serve"
        )
    return owners


def _too_large() -> PayloadTooLarge:
    return PayloadTooLarge(
        f"a report unpacks to more than {MAX_OCTETS // (1024 * 1024)} MiB: refused"
    )


def _capped(chunks: Iterator[bytes]) -> bytes:
    out = bytearray()
    for chunk in chunks:
        out += chunk
        if len(out) > MAX_OCTETS:
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
                raise InvalidRequest("the gzip'd report is cut short")
            yield chunk
    except zlib.error as error:
        raise InvalidRequest(f"the gzip'd report is damaged: {error}") from None


def _read_chunks(stream: IO[bytes]) -> Iterator[bytes]:
    while chunk := stream.read(_CHUNK):
        yield chunk


def _unzip(data: bytes) -> list[bytes]:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            members = [m for m in archive.infolist() if not m.is_dir()]
            if not members or len(members) > MAX_ZIP_MEMBERS:
                raise InvalidRequest(
                    f"a zipped report holds 1 to {MAX_ZIP_MEMBERS} files, not {len(members)}"
                )
            unpacked = []
            for member in members:
                if member.file_size > MAX_OCTETS:  # declared: refused before inflating
                    raise _too_large()
                with archive.open(member) as stream:  # the declared size may lie: capped
                    unpacked.append(_capped(_read_chunks(stream)))
            return unpacked
    except (zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as error:
        raise InvalidRequest(f"the zipped report is damaged: {error}") from None


def documents(
    data: bytes, plain_types: frozenset[str], plain_suffix: str, plain_start: bytes
) -> list[bytes]:
    """The documents a message carries, unpacked: each zip or gzip part, and each plain one
    (of `plain_types`, named with `plain_suffix` or starting with `plain_start`)."""
    message = email.parser.BytesParser(policy=email.policy.default).parsebytes(data)
    assert isinstance(message, EmailMessage)  # the default policy's message class
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
        elif (
            kind in plain_types
            or name.endswith(plain_suffix)
            or payload.lstrip().startswith(plain_start)
        ):
            if len(payload) > MAX_OCTETS:
                raise _too_large()
            found.append(payload)
    return found
