"""The direct MIME writer: the common shapes of outgoing messages as bytes, without building
the `email` package's object model.

It writes what engine/mail/mime_package.py writes, byte for byte (tests/test_delivery_mime.py
holds the two side by side): text/plain, text/html, multipart/alternative of both, and
multipart/mixed with attachments. Building, reparsing and folding every header with the
`email` package took ~1 ms a message, a third of the delivery path; here a plain header is
one string. The rules that decide what is plain are in engine/mail/header_fields.py; any
header or attachment that is not plain is still written by the `email` package's own
classes (`fold_field`, `attachment_part`), so the output never depends on a guess.

Bodies are encoded as the package's `set_content` does (the choice between 7bit,
quoted-printable and base64 is its heuristic, `_encode_text` below); multipart bodies are
laid out as its generator does.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Sequence
from datetime import datetime
from email import quoprimime
from email.headerregistry import Address, BaseHeader
from email.utils import format_datetime
from typing import Any

from engine.mail import mime_package
from engine.mail.header_fields import (
    ASCII_POLICY,
    FOLD_AT,
    VerbatimHeader,
    address_field,
    fold_field,
    header_text,
    text_field,
)
from engine.mail.mime_package import Boundaries
from engine.mail.outgoing import Attachment, OutgoingMessage

_CRLF = "\r\n"
_MAX_LINE_LENGTH = 78  # the policy's max_line_length: 7bit text lines, base64 line width
# A content type the package would write back as given: type/subtype tokens, no parameters.
_PLAIN_TYPE = re.compile(r"([A-Za-z0-9!#$&^_.+-]+)/([A-Za-z0-9!#$&^_.+-]+)")
# A filename written as filename="..." without escapes or RFC 2231 encoding.
_PLAIN_FILENAME = re.compile(r"[\x20\x21\x23-\x5b\x5d-\x7e]+")


def write(
    message: OutgoingMessage, fields: Sequence[tuple[str, Any]], boundaries: Boundaries
) -> bytes:
    """The message with its header `fields` (as `mime_package.write` takes them), for an
    all-ASCII header (`OutgoingMessage.needs_smtputf8` false)."""
    head = "".join(_field(name, value) for name, value in fields).encode("ascii")
    present = mime_package.bodies(message)
    mixed, alternative = boundaries
    if not message.attachments and len(present) == 1:
        return head + _text_part(*present[0])
    if not message.attachments:
        return head + _multipart("alternative", alternative, [_text_part(*b) for b in present])
    if len(present) == 1:
        first = _text_part(*present[0])
    else:
        first = _multipart("alternative", alternative, [_text_part(*b) for b in present])
    parts = [first, *(_attachment_part(attachment) for attachment in message.attachments)]
    return head + _multipart("mixed", mixed, parts)


def _field(name: str, value: Any) -> str:
    if isinstance(value, VerbatimHeader | BaseHeader):
        return fold_field(name, value)
    if isinstance(value, Address | list):
        return address_field(name, value)
    if isinstance(value, datetime):
        return f"{name}: {format_datetime(value)}{_CRLF}"
    return text_field(name, value)


def _multipart(subtype: str, boundary: str, parts: list[bytes]) -> bytes:
    """A multipart entity (its Content-Type, the blank line, then the parts), laid out as the
    generator does: every part is followed by CRLF before the next delimiter."""
    one_line = f'Content-Type: multipart/{subtype}; boundary="{boundary}"'
    if len(one_line) <= FOLD_AT:
        header = one_line + _CRLF
    else:
        header = f'Content-Type: multipart/{subtype};{_CRLF} boundary="{boundary}"{_CRLF}'
    delimiter = f"\r\n--{boundary}\r\n".encode()
    return (
        f"{header}{_CRLF}--{boundary}{_CRLF}".encode()
        + delimiter.join(parts)
        + f"{_CRLF}--{boundary}--{_CRLF}".encode()
    )


def _text_part(body: str, subtype: str) -> bytes:
    cte, payload = _encode_text(body)
    return (
        f'Content-Type: text/{subtype}; charset="utf-8"{_CRLF}'
        f"Content-Transfer-Encoding: {cte}{_CRLF}{_CRLF}"
    ).encode() + payload


def _encode_text(text: str) -> tuple[str, bytes]:
    """The transfer encoding `set_content` picks for UTF-8 text under a 7bit policy, and the
    body as the generator writes it (CRLF line ends).

    The stdlib's heuristic (email.contentmanager._encode_text): 7bit when every line is
    ASCII and at most 78 octets; else base64 or quoted-printable, whichever encodes the
    first ten lines shorter.
    """
    lines = text.encode("utf-8").splitlines()
    if max((len(line) for line in lines), default=0) <= _MAX_LINE_LENGTH:
        body = b"\r\n".join(lines) + b"\r\n"
        if body.isascii():
            return "7bit", body
    sniff = b"\r\n".join(lines[:10]) + b"\r\n"
    sniff_qp = quoprimime.body_encode(sniff.decode("latin-1"), _MAX_LINE_LENGTH)
    if len(sniff_qp) > len(binascii.b2a_base64(sniff)):
        return "base64", base64.encodebytes(b"\r\n".join(lines) + b"\r\n").replace(b"\n", b"\r\n")
    if len(lines) > 10:
        normal = (b"\n".join(lines) + b"\n").decode("latin-1")
        sniff_qp = quoprimime.body_encode(normal, _MAX_LINE_LENGTH)
    return "quoted-printable", _crlf(sniff_qp)


def _crlf(payload: str) -> bytes:
    """A payload's line ends as the generator writes them (any of CR, LF, CRLF -> CRLF)."""
    return re.sub(r"\r\n|\r|\n", _CRLF, payload).encode("ascii")


def _attachment_part(attachment: Attachment) -> bytes:
    filename = header_text("attachment filename", attachment.filename)
    kind = _PLAIN_TYPE.fullmatch(header_text("attachment content type", attachment.content_type))
    disposition = f'Content-Disposition: attachment; filename="{filename}"' if filename else ""
    if (
        kind is None
        or kind[1].lower() in ("multipart", "message")
        or len(kind[0]) + len("Content-Type: ") > FOLD_AT
        or (filename and not _PLAIN_FILENAME.fullmatch(filename))
        or len(disposition) > FOLD_AT
    ):
        part = mime_package.attachment_part(ASCII_POLICY, attachment)
        return part.as_bytes(policy=ASCII_POLICY)
    disposition = disposition or "Content-Disposition: attachment"
    return (
        f"Content-Type: {kind[0].lower()}{_CRLF}Content-Transfer-Encoding: base64{_CRLF}"
        f"{disposition}{_CRLF}{_CRLF}"
    ).encode() + base64.encodebytes(attachment.content).replace(b"\n", b"\r\n")
