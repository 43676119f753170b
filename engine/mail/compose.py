"""Outgoing messages as the RFC 5322 bytes that go on the wire.

`compose` turns an `OutgoingMessage` into CRLF-terminated bytes: the MIME structure (text,
html, both as multipart/alternative, attachments in multipart/mixed), RFC 2047 headers,
RFC 2231 filenames, and bodies in 7bit, quoted-printable or base64, so no line is over 998
bytes and no 8BITMIME is needed.

Two writers give the same bytes: the direct writer (engine/mail/mime_writer.py) for every
message with an ASCII header, and the stdlib `email` package (engine/mail/mime_package.py)
for messages to or from non-ASCII addresses (SMTPUTF8, RFC 6532). The header fields, their
order and values are decided once, here (`_fields`), for both.

Rules:
- Pure: Date, Message-ID and everything else come from the message, never the clock.
- Nothing a caller passes can add a header line (engine/mail/header_fields.py): line breaks
  and control characters in header text raise ValueError, and custom headers may not
  replace the headers Postroom owns (`validate_custom_headers`).
- Bcc recipients are not part of a message: they exist only in the SMTP envelope.
"""

from __future__ import annotations

import secrets
from email.headerregistry import Address
from typing import Any

from engine.mail import mime_package, mime_writer
from engine.mail.header_fields import (
    CONTROL,
    MAX_LINE,
    MESSAGE_ID,
    STRUCTURAL_HEADERS,
    TAGS_HEADER,
    URL,
    UTF8_POLICY,
    Mailbox,
    VerbatimHeader,
    address,
    custom_header_problems,
    encoded_addresses,
    encoded_text,
    header_text,
    header_text_problem,
    validate_custom_headers,
)
from engine.mail.mime_package import Boundaries
from engine.mail.outgoing import Attachment, OutgoingMessage

__all__ = [
    "CONTROL",
    "STRUCTURAL_HEADERS",
    "TAGS_HEADER",
    "Attachment",
    "Mailbox",
    "OutgoingMessage",
    "compose",
    "compose_directly",
    "compose_with_email_package",
    "header_text_problem",
    "validate_custom_headers",
]


# The longest word of a Subject the package writes beside "Subject: " on the first line.
_PLAIN_WORD = 68


def compose(message: OutgoingMessage) -> bytes:
    """The message as RFC 5322 bytes with CRLF line endings.

    Raises ValueError when it cannot be written safely: no body at all, a line break or
    control character in header text, a custom header `validate_custom_headers` refuses,
    a malformed Message-ID, address or unsubscribe URL, a naive date, or a header word too
    long for a 998-character line.
    """
    fields = _fields(message)
    boundaries = (_boundary(), _boundary())
    if message.needs_smtputf8:
        raw = mime_package.write(message, fields, boundaries, UTF8_POLICY)
    else:
        raw = mime_writer.write(message, fields, boundaries)
    return _checked(raw)


def compose_with_email_package(message: OutgoingMessage, boundaries: Boundaries) -> bytes:
    """`compose` through the `email` package alone, with the given multipart boundaries: the
    reference the direct writer is held to."""
    fields = _fields(message)
    policy = mime_package.policy_for(message.needs_smtputf8)
    return _checked(mime_package.write(message, fields, boundaries, policy))


def compose_directly(message: OutgoingMessage, boundaries: Boundaries) -> bytes:
    """`compose` through the direct writer, with the given multipart boundaries (ASCII
    headers only: `OutgoingMessage.needs_smtputf8` false)."""
    return _checked(mime_writer.write(message, _fields(message), boundaries))


def _checked(raw: bytes) -> bytes:
    # Bodies are wrapped by their encoding; a header could still hold an unbreakable word
    # (a huge tag or unsubscribe URL) that no folding fits in a line.
    header = raw[: raw.find(b"\r\n\r\n")]
    if any(len(line) > MAX_LINE for line in header.split(b"\r\n")):
        raise ValueError(f"a header line would be longer than {MAX_LINE} characters")
    return raw


def _fields(message: OutgoingMessage) -> list[tuple[str, Any]]:
    """The message's header fields in order, each with the value a message is given
    (`Address` objects, the date, verbatim or RFC 2047 text); checks them all."""
    if message.text is None and message.html is None:
        raise ValueError("a message needs a text or an html body")
    problems = custom_header_problems(message.headers)
    if problems:
        raise ValueError("; ".join(problems))
    if message.date.tzinfo is None or message.date.utcoffset() is None:
        raise ValueError("date must be timezone-aware")
    if not MESSAGE_ID.fullmatch(message.message_id):
        raise ValueError(f"message_id {message.message_id!r} is not <unique@domain>")
    utf8 = message.needs_smtputf8
    fields: list[tuple[str, Any]] = [
        (
            "From",
            _addresses("From", [address("from", (message.from_address, message.from_name))], utf8),
        )
    ]
    if message.to:
        fields.append(("To", _addresses("To", [address("to", box) for box in message.to], utf8)))
    if message.cc:
        fields.append(("Cc", _addresses("Cc", [address("cc", box) for box in message.cc], utf8)))
    if message.reply_to is not None:
        reply_to = [address("reply_to", message.reply_to)]
        fields.append(("Reply-To", _addresses("Reply-To", reply_to, utf8)))
    fields.append(("Subject", _subject(header_text("subject", message.subject), utf8)))
    fields.append(("Date", message.date))
    fields.append(("Message-ID", VerbatimHeader("Message-ID", message.message_id)))
    if message.list_unsubscribe is not None:
        uris = [message.list_unsubscribe]
        if message.list_unsubscribe_mailto is not None:
            uris.append(message.list_unsubscribe_mailto)
        if not all(URL.fullmatch(uri) for uri in uris):
            raise ValueError("list_unsubscribe must be a URL in printable ASCII")
        value = ", ".join(f"<{uri}>" for uri in uris)
        fields.append(("List-Unsubscribe", VerbatimHeader("List-Unsubscribe", value)))
        fields.append(
            (
                "List-Unsubscribe-Post",
                VerbatimHeader("List-Unsubscribe-Post", "List-Unsubscribe=One-Click"),
            )
        )
    custom = {name.lower() for name, _ in message.headers}
    if message.tags and message.tags_header and message.tags_header.lower() not in custom:
        tags = [header_text("tags", tag) for tag in message.tags]
        name = message.tags_header
        fields.append((name, _text(name, ", ".join(tags), utf8)))
    for name, value in message.headers:
        fields.append((name, _text(name, value, utf8)))
    fields.append(("MIME-Version", "1.0"))
    return fields


def _addresses(name: str, boxes: list[Address], utf8: bool) -> Any:
    """An address field's value: `encoded_addresses` when a display name is non-ASCII and
    the header is ASCII; else the addresses (one alone, as From and Reply-To are given)."""
    if not utf8 and any(not box.display_name.isascii() for box in boxes):
        return encoded_addresses(name, boxes)
    return boxes if name in ("To", "Cc") else boxes[0]


def _subject(value: str, utf8: bool) -> str:
    """The Subject's value: plain ASCII words as they are (the package folds them at their
    spaces), as `_text` otherwise. Text with "=?" is all encoded words, or a reader would
    take it for one; a longer ASCII word is kept verbatim (the package would move it to a
    continuation line, which reads back with a leading space), unless no line could hold it
    beside "Subject: ": the API takes 998 characters, and encoded words carry such a word
    across lines."""
    if "=?" in value or max(map(len, value.split()), default=0) > MAX_LINE - len("Subject: "):
        return encoded_text("Subject", value)
    if value.isascii() and len(max(value.split(" "), key=len)) <= _PLAIN_WORD:
        return value
    return _text("Subject", value, utf8)


def _text(name: str, value: str, utf8: bool) -> str:
    """A text field's value: verbatim, folded at its spaces, when it is ASCII or the header
    is UTF-8 (RFC 6532; the package would move UTF-8 text it does not encode to a
    continuation line), else encoded words (`encoded_text`)."""
    return VerbatimHeader(name, value) if utf8 or value.isascii() else encoded_text(name, value)


def _boundary() -> str:
    """A multipart boundary no body can contain: "=_" never occurs in quoted-printable or
    base64, and 7bit text would have to guess 128 random bits. (Given a boundary, the
    generator skips its search of every body for a collision.)"""
    return f"=_{secrets.token_hex(16)}"
