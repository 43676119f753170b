"""Outgoing messages as the RFC 5322 bytes that go on the wire.

`compose` turns an `OutgoingMessage` into CRLF-terminated bytes with the stdlib `email`
package: the MIME structure (text, html, both as multipart/alternative, attachments in
multipart/mixed), RFC 2047 headers, RFC 2231 filenames, and bodies in 7bit,
quoted-printable or base64, so no line is over 998 bytes and no 8BITMIME is needed.

Rules:
- Pure: Date, Message-ID and everything else come from the message, never the clock.
- Nothing a caller passes can add a header line. Line breaks and control characters in any
  header text raise ValueError (`header_text_problem` is that one rule; the send checks of
  engine/sending/intake.py apply it too, so the API answers 422 before anything is queued), and
  custom headers may not replace the headers Postroom owns (`validate_custom_headers`).
- Bcc recipients are not part of a message: they exist only in the SMTP envelope.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from email.headerregistry import Address, BaseHeader, HeaderRegistry
from email.message import MIMEPart
from email.policy import SMTP, SMTPUTF8, Policy

Mailbox = tuple[str, str | None]
"""An address and its optional display name: ("ada@example.com", "Ada Lovelace")."""

TAGS_HEADER = "X-Postroom-Tags"

# Set by compose, by DKIM signing or by the MTAs on the way; a custom header may not replace
# (or duplicate) one of these. Lower case.
STRUCTURAL_HEADERS = frozenset(
    name.lower()
    for name in (
        "From",
        "To",
        "Cc",
        "Bcc",
        "Subject",
        "Date",
        "Message-ID",
        "MIME-Version",
        "Content-Type",
        "Content-Transfer-Encoding",
        "Content-Disposition",
        "DKIM-Signature",
        "Return-Path",
        "Received",
        "Sender",
        "Reply-To",
        "List-Unsubscribe",
        "List-Unsubscribe-Post",
        TAGS_HEADER,
    )
)

MAX_LINE = 998  # RFC 5322 2.1.1, excluding the CRLF
_FOLD_AT = 78  # RFC 5322 2.1.1's "SHOULD" line length, where a header folds if it can


class _HeaderClasses(HeaderRegistry):
    """The stdlib registry builds a new class for every header it parses (~12 us, a tenth
    of composing a message); this builds one per kind of header and reuses it."""

    def __init__(self, *, use_default_map: bool = True) -> None:
        super().__init__(use_default_map=use_default_map)
        self._built: dict[object, type[BaseHeader]] = {}

    def __getitem__(self, name: str) -> type[BaseHeader]:
        kind = self.registry.get(name.lower(), self.default_class)
        built = self._built.get(kind)
        if built is None:
            built = self._built[kind] = super().__getitem__(name)
        return built


# cte_type="7bit": bodies are encoded so the message needs no 8BITMIME from the next hop.
_ASCII_POLICY = SMTP.clone(cte_type="7bit", header_factory=_HeaderClasses())
_UTF8_POLICY = SMTPUTF8.clone(cte_type="7bit", header_factory=_HeaderClasses())
_UNSTRUCTURED = _HeaderClasses(use_default_map=False)

_FIELD_NAME = re.compile(r"[\x21-\x39\x3b-\x7e]+")  # RFC 5322 ftext: printable ASCII but ':'
_LINE_BREAK = re.compile(r"[\r\n]")
# C0 and C1 controls (but TAB) and the Unicode line separators, which `str.splitlines` and
# some mail readers treat as line ends.
CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029]")
_MESSAGE_ID = re.compile(r"<[\x21-\x3b\x3d\x3f-\x7e]+@[\x21-\x3b\x3d\x3f-\x7e]+>")
_URL = re.compile(r"[\x21-\x3b\x3d\x3f-\x7e]+")  # printable ASCII but '<' and '>'


@dataclass(frozen=True, slots=True)
class Attachment:
    filename: str
    content_type: str  # "type/subtype", parameters allowed; unparseable means octet-stream
    content: bytes = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class OutgoingMessage:
    """Everything the headers and body of one email are made of (Bcc excepted)."""

    from_address: str
    from_name: str | None
    to: tuple[Mailbox, ...]
    subject: str
    message_id: str  # "<unique@sending-domain>", see `addresses.message_id`
    date: datetime  # timezone-aware
    cc: tuple[Mailbox, ...] = ()
    reply_to: Mailbox | None = None
    text: str | None = None
    html: str | None = None
    headers: tuple[tuple[str, str], ...] = ()  # custom headers, in order
    attachments: tuple[Attachment, ...] = ()
    tags: tuple[str, ...] = ()
    list_unsubscribe: str | None = None  # one-click (RFC 8058) unsubscribe URL

    @property
    def needs_smtputf8(self) -> bool:
        """Whether an address in the headers is non-ASCII, so the next hop must offer SMTPUTF8.

        Such a message carries its headers as raw UTF-8 (RFC 6532) instead of RFC 2047.
        """
        addresses = [self.from_address, *(email for email, _ in (*self.to, *self.cc))]
        if self.reply_to is not None:
            addresses.append(self.reply_to[0])
        return not all(address.isascii() for address in addresses)


def compose(message: OutgoingMessage) -> bytes:
    """The message as RFC 5322 bytes with CRLF line endings.

    Raises ValueError when it cannot be written safely: no body at all, a line break or
    control character in header text, a custom header `validate_custom_headers` refuses,
    a malformed Message-ID, address or unsubscribe URL, a naive date, or a header word too
    long for a 998-character line.
    """
    if message.text is None and message.html is None:
        raise ValueError("a message needs a text or an html body")
    problems = _custom_header_problems(message.headers)
    if problems:
        raise ValueError("; ".join(problems))
    if message.date.tzinfo is None or message.date.utcoffset() is None:
        raise ValueError("date must be timezone-aware")
    if not _MESSAGE_ID.fullmatch(message.message_id):
        raise ValueError(f"message_id {message.message_id!r} is not <unique@domain>")

    policy = _UTF8_POLICY if message.needs_smtputf8 else _ASCII_POLICY
    # A MIMEPart rather than an EmailMessage, whose parts would each repeat MIME-Version.
    msg = MIMEPart(policy=policy)
    msg["From"] = _address("from", (message.from_address, message.from_name))
    if message.to:
        msg["To"] = [_address("to", mailbox) for mailbox in message.to]
    if message.cc:
        msg["Cc"] = [_address("cc", mailbox) for mailbox in message.cc]
    if message.reply_to is not None:
        msg["Reply-To"] = _address("reply_to", message.reply_to)
    msg["Subject"] = _header_text("subject", message.subject)
    msg["Date"] = message.date
    msg["Message-ID"] = _VerbatimHeader("Message-ID", message.message_id)
    if message.list_unsubscribe is not None:
        if not _URL.fullmatch(message.list_unsubscribe):
            raise ValueError("list_unsubscribe must be a URL in printable ASCII")
        msg["List-Unsubscribe"] = _VerbatimHeader(
            "List-Unsubscribe", f"<{message.list_unsubscribe}>"
        )
        msg["List-Unsubscribe-Post"] = _VerbatimHeader(
            "List-Unsubscribe-Post", "List-Unsubscribe=One-Click"
        )
    if message.tags:
        tags = [_header_text("tags", tag) for tag in message.tags]
        msg[TAGS_HEADER] = _custom_header(TAGS_HEADER, ", ".join(tags))
    for name, value in message.headers:
        msg[name] = _custom_header(name, value)
    msg["MIME-Version"] = "1.0"
    _set_body(msg, message, policy)
    raw = msg.as_bytes()
    # Bodies are wrapped by their encoding; a header could still hold an unbreakable word
    # (a huge tag or unsubscribe URL) that no folding fits in a line.
    header = raw[: raw.find(b"\r\n\r\n")]
    if any(len(line) > MAX_LINE for line in header.split(b"\r\n")):
        raise ValueError(f"a header line would be longer than {MAX_LINE} characters")
    return raw


def header_text_problem(value: str) -> str | None:
    """What makes text unfit for a header line, or None when it is fit.

    A line break (CR, LF) would end the line and start a header of the caller's; any other
    control character (but TAB, RFC 5322 whitespace) is refused with it, since some mail
    readers also treat those as line ends.
    """
    if _LINE_BREAK.search(value):
        return "contains a line break (CR or LF)"
    if CONTROL.search(value):
        return "contains a control character"
    return None


def validate_custom_headers(headers: Mapping[str, str]) -> list[str]:
    """What is wrong with a send request's custom headers, one sentence each; empty if fine."""
    return _custom_header_problems(headers.items())


def _custom_header_problems(headers: Iterable[tuple[str, str]]) -> list[str]:
    problems: list[str] = []
    for name, value in headers:
        if not _FIELD_NAME.fullmatch(name):
            problems.append(
                f"{name!r} is not a valid header name (printable ASCII, no spaces or colons)"
            )
            continue
        if name.lower() in STRUCTURAL_HEADERS:
            problems.append(f"header {name!r} is set by Postroom and cannot be overridden")
        problem = header_text_problem(value)
        if problem is not None:
            problems.append(f"header {name!r} {problem}")
        elif len(value) > MAX_LINE:
            problems.append(f"header {name!r} is longer than {MAX_LINE} characters")
        elif value.isascii() and _longest_line(_VerbatimHeader(name, value)) > MAX_LINE:
            problems.append(
                f"header {name!r} has a word too long to fit a {MAX_LINE}-character line"
            )
    return problems


class _VerbatimHeader(str):
    """An ASCII header written as given, folded only at its spaces, never RFC 2047-encoded.

    The email package encodes any word too long for a 78-column line as an encoded-word,
    which breaks structured headers (a long List-Unsubscribe URL, In-Reply-To, References).
    This follows its header-object protocol (a `name` and `fold(policy=...)`, see
    `EmailPolicy.header_store_parse`), so a message stores and writes it unchanged.
    """

    name: str

    def __new__(cls, name: str, value: str) -> _VerbatimHeader:
        header = super().__new__(cls, value)
        header.name = name
        return header

    def fold(self, *, policy: Policy) -> str:
        first, *words = self.split(" ")
        # The first word stays beside the name: a value starting on a continuation line
        # would read back with a leading space.
        lines = [f"{self.name}: {first}"]
        for word in words:
            # Fold before a space (which starts the continuation line) when the line would
            # pass 78 columns, unless that leaves a line of only whitespace or the word is too
            # long for any line of 78 and still fits this one.
            joined = len(lines[-1]) + 1 + len(word)
            if (
                joined <= _FOLD_AT
                or not lines[-1].strip()
                or (1 + len(word) > _FOLD_AT and joined <= MAX_LINE)
            ):
                lines[-1] += " " + word
            else:
                lines.append(" " + word)
        return policy.linesep.join(lines) + policy.linesep


def _longest_line(header: _VerbatimHeader) -> int:
    return max(len(line) for line in header.fold(policy=_ASCII_POLICY).split("\r\n"))


def _custom_header(name: str, value: str) -> str:
    """ASCII values verbatim (they may be structured); others as RFC 2047 unstructured text."""
    if value.isascii():
        return _VerbatimHeader(name, value)
    return _UNSTRUCTURED(name, value)


def _header_text(what: str, value: str) -> str:
    problem = header_text_problem(value)
    if problem is not None:
        raise ValueError(f"{what} {problem}")
    return value


def _address(what: str, mailbox: Mailbox) -> Address:
    email, name = mailbox
    username, at, domain = _header_text(what, email).rpartition("@")
    if not username or not at or not domain or " " in domain:
        raise ValueError(f"{what}: {email!r} is not an email address")
    # username/domain rather than addr_spec: no reparsing, and a local part that needs
    # quoting is quoted.
    return Address(_header_text(what, name or ""), username=username, domain=domain)


def _set_body(msg: MIMEPart, message: OutgoingMessage, policy: Policy) -> None:
    """text/plain, text/html or multipart/alternative (text first); multipart/mixed around
    it when there are attachments."""
    present = [
        (body, subtype)
        for body, subtype in ((message.text, "plain"), (message.html, "html"))
        if body is not None
    ]
    if not message.attachments and len(present) == 1:
        body, subtype = present[0]
        msg.set_content(body, subtype=subtype)
        return
    if message.attachments:
        msg.make_mixed(boundary=_boundary())
        if len(present) == 1:
            body, subtype = present[0]
            msg.attach(_text_part(policy, body, subtype))
        else:
            msg.attach(_alternative(MIMEPart(policy=policy), present, policy))
        for attachment in message.attachments:
            msg.attach(_attachment_part(policy, attachment))
    else:
        _alternative(msg, present, policy)


def _alternative(container: MIMEPart, bodies: list[tuple[str, str]], policy: Policy) -> MIMEPart:
    container.make_alternative(boundary=_boundary())
    for body, subtype in bodies:
        container.attach(_text_part(policy, body, subtype))
    return container


def _boundary() -> str:
    """A multipart boundary no body can contain: "=_" never occurs in quoted-printable or
    base64, and 7bit text would have to guess 128 random bits. (Given a boundary, the
    generator skips its search of every body for a collision.)"""
    return f"=_{secrets.token_hex(16)}"


def _text_part(policy: Policy, body: str, subtype: str) -> MIMEPart:
    part = MIMEPart(policy=policy)
    part.set_content(body, subtype=subtype)
    return part


def _attachment_part(policy: Policy, attachment: Attachment) -> MIMEPart:
    filename = _header_text("attachment filename", attachment.filename)
    maintype, subtype, params = _content_type(
        _header_text("attachment content type", attachment.content_type)
    )
    part = MIMEPart(policy=policy)
    part.set_content(
        attachment.content,
        maintype,
        subtype,
        disposition="attachment",
        filename=filename or None,
        params=params,
    )
    return part


def _content_type(value: str) -> tuple[str, str, dict[str, str]]:
    """The type, subtype and parameters of an attachment's content type.

    application/octet-stream when it does not parse, and for multipart/* and message/*:
    a multipart needs a boundary of its own and message/* may not be base64-encoded
    (RFC 2046 5.2), so such content travels as an opaque file.
    """
    header = _ASCII_POLICY.header_factory("Content-Type", value)
    maintype: str = header.maintype
    if header.defects or maintype in ("multipart", "message"):
        return "application", "octet-stream", {}
    return maintype, header.subtype, dict(header.params)
