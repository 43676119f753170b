"""Outcomes kept through an outage, on the node's own disk (POSTROOM_SPOOL_DIR) until the
database takes them: a process that ends before it answers (a stop, the 60 s give-up, a kill)
leaves them to the next delivery router started on that disk, which writes them before it
delivers anything, so what was delivered is not sent again because the process ended during
the outage (as Postfix's queue files outlive its processes).

One file per save, `kept-<token>.json`, written whole (a temporary file, fsync, rename, fsync
of the directory): a file is there complete or not at all. A file is held under an exclusive
`flock` by the process that saved or adopted it until its outcomes are written and it is
unlinked (the lock is taken before the rename, so no other process can adopt a file while
its writer still holds it): two processes on one spool never write one file twice, and a
process that dies holding one leaves it to the next. A file that cannot be read, or whose
outcomes the database refused, is set aside under another name (`.unreadable`,
`.unwritten`) for the operator, never tried again at every start.

The outcomes name recipients' addresses: the directory is created 0700, the files 0600.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.delivery.domain_queue import Kept, Outcomes
from engine.delivery.full_mailboxes import FullMailboxes
from storage.codec import parse_optional_timestamp, parse_timestamp, timestamp
from storage.emails import Event, RecipientUpdate
from storage.incidents import Hit
from storage.suppressions import Suppression

log = logging.getLogger("postroom.delivery")

VERSION = 1  # of the file's form; a file of another is set aside, not guessed at
PATTERN = "kept-*.json"


@dataclass(slots=True)
class Adopted:
    """A journal file this process holds (its `flock` open) with the outcomes it keeps."""

    path: Path
    fd: int
    kept: list[Kept]


class Journal:
    """The kept outcomes of one spool directory."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def save(self, kept: Sequence[Kept]) -> Adopted:
        """Write `kept` to a new file, durably, held by this process."""
        text = json.dumps({"version": VERSION, "kept": [_kept(each) for each in kept]})
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        path = self.directory / f"kept-{secrets.token_hex(8)}.json"
        partial = path.with_suffix(".partial")
        fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # a new file: nobody else can hold it
            data = memoryview(text.encode())
            while data:
                data = data[os.write(fd, data) :]
            os.fsync(fd)
            os.replace(partial, path)
            _sync_directory(self.directory)
        except BaseException:
            os.close(fd)
            partial.unlink(missing_ok=True)
            raise
        return Adopted(path, fd, list(kept))

    def adopt(self) -> list[Adopted]:
        """The files no other process holds, each locked and read; those that cannot be read
        are set aside."""
        if not self.directory.is_dir():
            return []
        adopted = []
        for path in sorted(self.directory.glob(PATTERN)):
            held = _hold(path)
            if held is None:
                continue
            try:
                kept = _read(held, path)
            except (OSError, ValueError, KeyError, TypeError, IndexError) as exc:
                log.error(
                    "could not read the kept outcomes in %s (%s): set aside as %s; those"
                    " recipients may be delivered again",
                    path,
                    exc,
                    path.with_suffix(".unreadable").name,
                )
                _set_aside(path, held, ".unreadable")
                continue
            adopted.append(Adopted(path, held, kept))
        return adopted

    def done(self, adopted: Sequence[Adopted]) -> None:
        """The outcomes of `adopted` are written: their files go."""
        for each in adopted:
            _release(each.path, each.fd)
        if adopted:
            _sync_directory(self.directory)

    def refused(self, adopted: Sequence[Adopted]) -> None:
        """The database refused the outcomes of `adopted` (not an outage): set aside."""
        for each in adopted:
            _set_aside(each.path, each.fd, ".unwritten")


def _hold(path: Path) -> int | None:
    """An open, exclusively locked descriptor of `path`; None when another process holds it
    or it went (another adopted and unlinked it between the listing and the lock)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.fstat(fd).st_ino != os.stat(path).st_ino:
            raise FileNotFoundError(path)  # replaced since it was opened
    except OSError:
        os.close(fd)
        return None
    return fd


def _release(path: Path, fd: int) -> None:
    try:
        path.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _set_aside(path: Path, fd: int, suffix: str) -> None:
    try:
        path.rename(path.with_suffix(suffix))
    except OSError:
        log.exception("could not set %s aside", path)
    finally:
        os.close(fd)


def _sync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read(fd: int, path: Path) -> list[Kept]:
    with os.fdopen(os.dup(fd), "rb") as file:
        data = json.loads(file.read())
    version = data.get("version") if isinstance(data, dict) else None
    if version != VERSION:
        raise ValueError(f"version {version!r}, not {VERSION}")
    return [_parse_kept(each) for each in data["kept"]]


# The file's form: one object per `Kept`, its lists as arrays of their fields in order.


def _kept(each: Kept) -> dict[str, Any]:
    part = each.part
    return {
        "key": each.key,
        "node": each.node,
        "now": timestamp(part.now),
        "updates": [
            [
                u.email_id,
                u.address,
                u.status,
                None if u.next_attempt_at is None else timestamp(u.next_attempt_at),
                u.last_response,
            ]
            for u in part.updates
        ],
        "events": [
            [
                e.id,
                e.email_id,
                e.workspace_id,
                e.event_type,
                e.recipient,
                e.metadata,
                timestamp(e.created_at),
            ]
            for e in part.events
        ],
        "bounces": [
            [workspace_id, s.email, s.reason, timestamp(s.created_at), s.source_email_id]
            for workspace_id, s in part.bounces
        ],
        "hits": [
            [list(pair), hit.kind, hit.sending_domain, hit.sample_reply]
            for pair, hit in part.hits.items()
        ],
        "delivered": [list(pair) for pair in part.delivered],
        "full": [
            [f.workspace_id, f.email_id, f.address, f.status, f.update, f.event]
            for f in part.mailboxes.full
        ],
        "reached": [list(each) for each in part.mailboxes.reached],
    }


def _parse_kept(data: dict[str, Any]) -> Kept:
    mailboxes = FullMailboxes()
    for workspace_id, email_id, address, status, update, event in data["full"]:
        mailboxes.note_full(workspace_id, email_id, address, status, update, event)
    for workspace_id, address in data["reached"]:
        mailboxes.note_delivered(workspace_id, address)
    part = Outcomes(
        updates=[
            RecipientUpdate(email_id, address, status, parse_optional_timestamp(at), response)
            for email_id, address, status, at, response in data["updates"]
        ],
        events=[
            Event(id_, email_id, workspace_id, kind, recipient, metadata, parse_timestamp(at))
            for id_, email_id, workspace_id, kind, recipient, metadata, at in data["events"]
        ],
        bounces=[
            (workspace_id, Suppression(address, reason, parse_timestamp(at), source))
            for workspace_id, address, reason, at, source in data["bounces"]
        ],
        now=parse_timestamp(data["now"]),
        hits={
            (pair[0], pair[1]): Hit(kind, sending_domain, sample)
            for pair, kind, sending_domain, sample in data["hits"]
        },
        delivered={(pair[0], pair[1]) for pair in data["delivered"]},
        mailboxes=mailboxes,
    )
    return Kept(data["key"], part, data["node"])
