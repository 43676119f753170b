"""Emails whose message arrives complete (SMTP submission, forwards) and is sent as given.

`store_raw` writes one such email in the caller's unit of work: the row the email log shows
(subject, From, To and Cc read from the message's header; the bcc are the envelope
recipients the header does not name), a `queued` recipient per envelope recipient, the
`queued` event, the monthly volume, and the message bytes themselves. Delivery sends
the bytes as they are, DKIM-signed with the domain's key, from the email's bounce address,
with Message-ID and Date added only if the message lacks them (engine/delivery/messages.py).

Rules: no suppression or plan check here (the submission server checks at RCPT, forwards
decide for themselves); the message is stored before anyone answers "accepted"; delivery on
every node hears of it once it is committed (`storage.emails.insert`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from email.header import decode_header, make_header
from email.utils import getaddresses
from typing import Any

from engine.platform.errors import NotFound
from engine.platform.runtime import Runtime
from engine.sending import intake
from engine.sending.intake import Mailbox, NewEmail
from storage import domains
from storage.domains import Domain
from storage.tx import Tx

SOURCES = ("smtp", "forward")
_MESSAGE_ID = re.compile(r"<[\x21-\x3b\x3d\x3f-\x7e]{1,900}@[\x21-\x3b\x3d\x3f-\x7e]{1,255}>")
_READ_FIELDS = frozenset({"from", "sender", "to", "cc", "subject", "message-id"})
_SUBJECT_LIMIT = 998  # one header line's worth: the log shows a subject, not a document


@dataclass(frozen=True, slots=True)
class RawMail:
    """A complete RFC 5322 message to send from `from_email` (the envelope sender the
    client gave; delivery uses the bounce address) on a domain of the workspace."""

    workspace_id: str
    domain_id: str
    from_email: str
    recipients: list[str]
    data: bytes
    source: str
    requiretls: bool = False  # submitted with REQUIRETLS (RFC 8689): verified TLS only


@dataclass(frozen=True, slots=True)
class HeaderSummary:
    """What the email log shows of a message, read from its header, and the originator
    fields as given (one entry per field) for the submission rule to check."""

    subject: str
    from_address: str | None
    from_name: str | None
    to: list[dict[str, Any]]
    cc: list[dict[str, Any]]
    message_id: str | None
    from_fields: tuple[str, ...]
    sender_fields: tuple[str, ...]


def _mailboxes(values: list[str]) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    for name, address in getaddresses(values):
        if "@" in address:
            found.append({"email": address.lower(), "name": _decoded(name) or None})
    return found


def _header_fields(data: bytes) -> dict[str, list[str]]:
    """The header's fields by lower-case name, unfolded (RFC 5322 2.2.3), as text.

    Hand-written because the email package's parser costs ~0.4 ms a message, a large part
    of the relay's whole budget; only the few fields the log and the originator check read
    are kept. Lines end in CRLF only (the SMTP server refuses bare CR and LF), and the
    header ends at the first empty line, as for every reader of the message: a From the
    recipient would not see must not count, nor one it would see be missed.
    """
    end = 0 if data.startswith(b"\r\n") else data.find(b"\r\n\r\n")
    header = (data if end < 0 else data[:end]).decode("utf-8", "replace")
    fields: dict[str, list[str]] = {}
    name = None
    for line in header.split("\r\n"):
        if line[:1] in (" ", "\t"):
            if name is not None:
                fields[name][-1] += " " + line.strip()
            continue
        field, colon, value = line.partition(":")
        name = field.strip().lower() if colon else None
        if name in _READ_FIELDS:
            fields.setdefault(name, []).append(value.strip())
        else:
            name = None
    return fields


def _decoded(value: str) -> str:
    """Text with RFC 2047 encoded words decoded (malformed ones are kept as they are)."""
    if "=?" not in value:
        return value
    try:
        return str(make_header(decode_header(value)))
    except (ValueError, LookupError, UnicodeError):
        return value


def summarize(data: bytes) -> HeaderSummary:
    """Subject, From, To, Cc and Message-ID of a message (missing or malformed: empty)."""
    fields = _header_fields(data)
    senders = _mailboxes(fields.get("from", []))
    subjects = fields.get("subject", [])
    ids = fields.get("message-id", [])
    return HeaderSummary(
        subject=" ".join(_decoded(subjects[0]).split())[:_SUBJECT_LIMIT] if subjects else "",
        from_address=senders[0]["email"] if senders else None,
        from_name=senders[0]["name"] if senders else None,
        to=_mailboxes(fields.get("to", [])),
        cc=_mailboxes(fields.get("cc", [])),
        message_id=ids[0] if ids and _MESSAGE_ID.fullmatch(ids[0]) else None,
        from_fields=tuple(fields.get("from", [])),
        sender_fields=tuple(fields.get("sender", [])),
    )


def store_raw(tx: Tx, mail: RawMail, now: datetime, shard: int) -> str:
    """Store an email sent as given, queued for delivery; its id. In the caller's unit of
    work, counted in the node's volume `shard`. NotFound if the domain is gone.
    """
    new = raw_email(mail, sending_domain(tx, mail), summarize(mail.data))
    [email] = intake.store(tx, [new], now, volume_shard=shard)
    return email.id


def sending_domain(tx: Tx, mail: RawMail) -> Domain:
    """The domain a message sent as given goes out from; NotFound if it is gone."""
    domain = domains.get(tx, mail.workspace_id, mail.domain_id)
    if domain is None:
        raise NotFound("the sending domain does not exist")
    return domain


def raw_email(mail: RawMail, domain: Domain, summary: HeaderSummary) -> NewEmail:
    """The email to store for a message sent as given, from its `sending_domain` and the
    `summarize` of its data (`intake.store` stores any number of them at once)."""
    if mail.source not in SOURCES:
        raise ValueError(f"source must be one of {SOURCES}, not {mail.source!r}")
    if not mail.recipients:
        raise ValueError("a message needs at least one recipient")
    recipients = tuple(dict.fromkeys(_address(r) for r in mail.recipients))
    named = {box["email"] for box in summary.to + summary.cc}
    # A message whose header names nobody (a list, an undisclosed-recipients group) is shown
    # as sent to its envelope recipients.
    to = summary.to if named else [{"email": r, "name": None} for r in recipients]
    return NewEmail(
        workspace_id=mail.workspace_id,
        domain_id=domain.id,
        domain_name=domain.name,
        from_email=summary.from_address or _address(mail.from_email),
        from_name=summary.from_name,
        to=_mailboxes_of(to),
        cc=_mailboxes_of(summary.cc),
        bcc=tuple(Mailbox(r) for r in recipients if named and r not in named),
        subject=summary.subject,
        source=mail.source,
        raw=mail.data,
        message_id=summary.message_id,
        envelope=recipients,
        requiretls=mail.requiretls,
    )


def _mailboxes_of(boxes: list[dict[str, Any]]) -> tuple[Mailbox, ...]:
    return tuple(Mailbox(str(box["email"]), box.get("name")) for box in boxes)


def _address(address: str) -> str:
    """Addresses are kept lower-cased, as everywhere in Postroom (docs/decisions.md)."""
    local, at, domain = address.strip().rpartition("@")
    if not at or not local or not domain:
        raise ValueError(f"{address!r} is not an email address")
    return f"{local}@{domain}".lower()


async def queue_raw(rt: Runtime, mail: RawMail) -> str:
    """Store an email sent as given (committed when this returns; delivery hears of it)."""
    return await rt.db.write(store_raw, mail, rt.clock.now(), rt.usage_shard)
