"""CSV import into a contact list: streamed, validated off the event loop, stored in chunks.

Rules (spec: Contacts, CSV rules):
- The first row holds the headers; the `email` column is found case-insensitively, a `name`
  column fills the contact's name, every other named column becomes metadata.
- A row without an email, or whose address is already in the list (or earlier in the file),
  is skipped; a row with an invalid address, too many fields or too much metadata, or one
  that would pass the plan's contacts-per-list limit, is reported in `errors` as
  `row N: reason`. Rows are numbered as a spreadsheet shows them: the header is row 1.
- 400 for an empty file, a file without an email column, or one without data rows; these
  are found before anything is stored.

The file is read through a text stream (UTF-8, with or without BOM) `CHUNK` rows at a time;
each chunk is parsed in a worker thread (the next one while the last is being stored) and
stored in one transaction of multi-row inserts, so memory stays bounded and other writers
are not held up for the whole import. An import stopped half-way leaves the chunks already
stored; importing the file again skips them.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import IO, Any

import trio

from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.contacts.lists import CappedErrors, check_metadata, locked_list, room_left
from engine.platform.errors import EngineError, InvalidRequest, NotFound
from engine.platform.runtime import Principal, Runtime
from engine.templates.variables import header_safe
from storage import contacts
from storage.codec import new_id
from storage.contacts import Contact
from storage.tx import Tx

CHUNK = 2_000


@dataclass(frozen=True, slots=True)
class ImportResult:
    imported: int
    skipped: int
    errors: list[str]


@dataclass(frozen=True, slots=True)
class _Row:
    number: int
    email: str
    name: str | None
    metadata: dict[str, Any] | None


@dataclass(slots=True)
class _Chunk:
    rows: list[_Row] = field(default_factory=list)
    skipped: int = 0
    errors: list[tuple[int, str]] = field(default_factory=list)  # (row number, reason)
    # The reader failed (bad encoding, malformed CSV): nothing after this chunk is read.
    stopped: bool = False


@dataclass(frozen=True, slots=True)
class _Columns:
    width: int
    email: int
    name: int | None
    metadata: list[tuple[int, str]]


def _columns(header: list[str]) -> _Columns:
    names = [cell.strip() for cell in header]
    lowered = [name.lower() for name in names]
    if "email" not in lowered:
        raise InvalidRequest(
            "the CSV file has no `email` column in its header row", code="no_email_column"
        )
    email = lowered.index("email")
    name = lowered.index("name") if "name" in lowered else None
    seen: set[str] = set()
    metadata = []
    for index, key in enumerate(names):
        if index in (email, name) or not key or key in seen:
            continue  # a blank or repeated header names no new field
        seen.add(key)
        metadata.append((index, key))
    return _Columns(len(names), email, name, metadata)


class _Reader:
    """Parses a CSV upload chunk by chunk (called from a worker thread)."""

    def __init__(self, stream: IO[bytes]) -> None:
        self._text = io.TextIOWrapper(stream, encoding="utf-8-sig", newline="")
        self._records: Iterator[list[str]] = csv.reader(self._text)
        self._number = 0
        self._columns: _Columns | None = None
        self._seen_data = False

    def header(self) -> None:
        """Read the header row; InvalidRequest when there is none or it lacks `email`."""
        try:
            for record in self._records:
                self._number += 1
                if any(cell.strip() for cell in record):
                    self._columns = _columns(record)
                    return
        except (UnicodeDecodeError, csv.Error) as exc:
            raise InvalidRequest(
                f"the file is not readable CSV: {exc}", code="invalid_csv"
            ) from None
        raise InvalidRequest("the CSV file is empty", code="empty_csv")

    def next_chunk(self) -> _Chunk | None:
        """Up to CHUNK data rows, checked; None at the end of the file."""
        assert self._columns is not None
        chunk = _Chunk()
        in_chunk: set[str] = set()
        read = 0
        try:
            for record in self._records:
                self._number += 1
                if not any(cell.strip() for cell in record):
                    continue
                self._seen_data = True
                self._check(record, chunk, in_chunk)
                read += 1
                if read == CHUNK:
                    return chunk
        except (UnicodeDecodeError, csv.Error) as exc:
            if not self._seen_data:
                raise InvalidRequest(
                    f"the file is not readable CSV: {exc}", code="invalid_csv"
                ) from None
            chunk.errors.append(
                (
                    self._number + 1,
                    f"the file is not readable from here on ({exc}); the rest was not imported",
                )
            )
            chunk.stopped = True
            return chunk
        if not self._seen_data:
            raise InvalidRequest("the CSV file has no data rows", code="no_data_rows")
        return chunk if read else None

    def _check(self, record: list[str], chunk: _Chunk, in_chunk: set[str]) -> None:
        columns = self._columns
        assert columns is not None
        number = self._number
        if len(record) > columns.width:
            chunk.errors.append(
                (number, f"{len(record)} fields, but the header has {columns.width}")
            )
            return
        cells = record + [""] * (columns.width - len(record))
        raw_email = cells[columns.email].strip()
        if not raw_email:
            chunk.skipped += 1
            return
        try:
            email = normalize_email(raw_email)
        except EngineError:
            chunk.errors.append((number, f"invalid email address {raw_email!r}"))
            return
        if email in in_chunk:
            chunk.skipped += 1
            return
        metadata = {key: cells[index] for index, key in columns.metadata if cells[index] != ""}
        try:
            checked = check_metadata(metadata)
        except EngineError as exc:
            chunk.errors.append((number, exc.detail))
            return
        name = header_safe(cells[columns.name]) if columns.name is not None else None
        in_chunk.add(email)
        chunk.rows.append(_Row(number, email, name, checked))


@dataclass(frozen=True, slots=True)
class _Stored:
    imported: int
    skipped: int
    over_limit: list[int]


def _store(tx: Tx, who: Principal, list_id: str, rows: list[_Row], now: datetime) -> _Stored:
    found = locked_list(tx, who, list_id)
    existing = contacts.existing_emails(tx, found.id, [row.email for row in rows])
    room = room_left(who, found)
    new: list[Contact] = []
    skipped = 0
    over_limit: list[int] = []
    for row in rows:
        if row.email in existing:
            skipped += 1
        elif room is not None and len(new) >= room:
            over_limit.append(row.number)
        else:
            new.append(Contact(new_id(), found.id, row.email, row.name, row.metadata, now))
    contacts.add(tx, found.id, new)
    return _Stored(len(new), skipped, over_limit)


def _log(tx: Tx, who: Principal, list_id: str, result: ImportResult, now: datetime) -> None:
    found = contacts.get_list(tx, who.workspace_id, list_id)
    if found is None:
        return  # deleted meanwhile: its deletion is logged instead
    meta = {"imported": result.imported, "skipped": result.skipped, "errors": len(result.errors)}
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("contact_list.imported", found.name, found.id, meta),
        now,
    )


async def _read_into(reader: _Reader, into: list[_Chunk | None]) -> None:
    into.append(await trio.to_thread.run_sync(reader.next_chunk))


async def import_csv(rt: Runtime, who: Principal, list_id: str, stream: IO[bytes]) -> ImportResult:
    """Import a CSV file into a list; NotFound for an unknown list, InvalidRequest per 400."""
    if await rt.db.read(contacts.get_list, who.workspace_id, list_id) is None:
        raise NotFound("contact list not found")
    reader = _Reader(stream)
    await trio.to_thread.run_sync(reader.header)
    now = rt.clock.now()
    imported = skipped = 0
    errors = CappedErrors()
    limit_note = ""
    chunk = await trio.to_thread.run_sync(reader.next_chunk)
    while chunk is not None:
        following: list[_Chunk | None] = []
        async with trio.open_nursery() as nursery:
            if not chunk.stopped:  # parse the next chunk while this one is stored
                nursery.start_soon(_read_into, reader, following)
            stored = await rt.db.transaction(_store, who, list_id, chunk.rows, now)
        imported += stored.imported
        skipped += chunk.skipped + stored.skipped
        if stored.over_limit and not limit_note:
            limit_note = f"the {who.plan} plan's contacts-per-list limit is reached"
        reported = chunk.errors + [(number, limit_note) for number in stored.over_limit]
        for number, reason in sorted(reported):  # in file order
            errors.add(f"row {number}: {reason}")
        chunk = following[0] if following else None
    result = ImportResult(imported, skipped, errors.result())
    if imported:
        await rt.db.write(_log, who, list_id, result, rt.clock.now())
    return result
