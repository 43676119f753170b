"""What a forwarded message looks like: the copy sent on by email, the JSON POSTed to URLs.

Pure functions over the message bytes. The emailed copy is the original, byte for byte,
under two added trace headers (`X-Original-To`, `X-Forwarded-For: <source> <destination>`),
so its From, Subject, body and any DKIM signature of the original are left intact (as the
MX kept it: under its own Received and Authentication-Results fields); the envelope, the
ARC set and our own DKIM signature are the delivery engine's. Headers the receiving
server adds itself (Return-Path, Delivered-To) are dropped from the copy. The JSON document
is a lossless summary: every header in order, both bodies, attachments in base64.
"""

from __future__ import annotations

import base64
import email.policy
import re
from dataclasses import dataclass
from email.message import EmailMessage, Message
from email.parser import BytesParser
from email.utils import getaddresses
from typing import Any

_PARSER = BytesParser(policy=email.policy.default)
_DROPPED = re.compile(rb"(?im)^(return-path|delivered-to):.*\r?\n(?:[ \t].*\r?\n)*")


@dataclass(frozen=True, slots=True)
class Summary:
    """What the forward log shows of a message."""

    from_address: str
    subject: str
    message_id: str


def _header_end(data: bytes) -> int:
    for separator in (b"\r\n\r\n", b"\n\n"):
        end = data.find(separator)
        if end >= 0:
            return end + len(separator) // 2
    return len(data)


def _text(message: Message, name: str) -> str:
    try:
        value = message.get(name)
    except (ValueError, IndexError, TypeError):  # a header the parser cannot make sense of
        return ""
    return "" if value is None else " ".join(str(value).split())


def already_forwarded_by(data: bytes, source: str) -> bool:
    """Whether the message already passed through the forward of `source` (a loop)."""
    header = _PARSER.parsebytes(data[: _header_end(data)], headersonly=True)
    return any(str(v).strip().lower() == source for v in header.get_all("X-Original-To") or [])


def summary(data: bytes, envelope_from: str) -> Summary:
    header = _PARSER.parsebytes(data[: _header_end(data)], headersonly=True)
    senders = [a for _, a in getaddresses([_text(header, "From")]) if "@" in a]
    return Summary(
        from_address=senders[0].lower() if senders else envelope_from,
        subject=_text(header, "Subject")[:998],
        message_id=_text(header, "Message-ID")[:998],
    )


def forwarded_copy(data: bytes, source: str, destination: str) -> bytes:
    """The message as sent on to one destination address."""
    end = _header_end(data)
    header = _DROPPED.sub(b"", data[:end])
    trace = (f"X-Original-To: {source}\r\nX-Forwarded-For: {source} {destination}\r\n").encode(
        "ascii"
    )
    return b"".join([trace, header, memoryview(data)[end:]])  # the body copied once


def _decoded(name: str, raw: str) -> str:
    try:
        value = str(email.policy.default.header_fetch_parse(name, raw))
    except (ValueError, IndexError, TypeError):
        value = raw
    return " ".join(value.split())


def _content(part: EmailMessage) -> str | None:
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # unknown charset or broken encoding
        raw = part.get_payload(decode=True)
        content = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else None
    # Line ends as JSON consumers expect them, not as SMTP carries them.
    return content.replace("\r\n", "\n") if isinstance(content, str) else None


def _body(message: EmailMessage, kind: str) -> str | None:
    part = message.get_body(preferencelist=(kind,))
    return None if part is None else _content(part)  # type: ignore[arg-type]


def _attachments(message: EmailMessage) -> list[dict[str, Any]]:
    found = []
    for part in message.iter_attachments():
        payload = part.get_payload(decode=True)
        content = payload if isinstance(payload, bytes) else b""
        found.append(
            {
                "filename": part.get_filename(),
                "content_type": part.get_content_type(),
                "size": len(content),
                "content": base64.b64encode(content).decode("ascii"),
            }
        )
    return found


def json_document(data: bytes) -> dict[str, Any]:
    """The message as a JSON-ready document: from, to, subject, text, html, headers,
    attachments (filename, content_type, size, base64 content)."""
    message = _PARSER.parsebytes(data)
    assert isinstance(message, EmailMessage)
    headers = [{"name": name, "value": _decoded(name, raw)} for name, raw in message.raw_items()]
    return {
        "from": _text(message, "From"),
        "to": _text(message, "To"),
        "cc": _text(message, "Cc"),
        "subject": _text(message, "Subject"),
        "message_id": _text(message, "Message-ID"),
        "date": _text(message, "Date"),
        "text": _body(message, "plain"),
        "html": _body(message, "html"),
        "headers": headers,
        "attachments": _attachments(message) if message.is_multipart() else [],
    }
