"""The SMTP grammar shared by both sides: reply framing, EHLO keywords, paths, message data.

Pure functions and one incremental parser, no I/O. Rules: what we send never contains a
bare CR or LF (line endings are normalised, paths with control characters or angle
brackets are refused, so no input can smuggle a second command); what we read is bounded
(a reply line is at most `MAX_REPLY_LINE` octets and a reply at most `MAX_REPLY_LINES`
lines), and anything else the server sends is a `ProtocolError`.
"""

from __future__ import annotations

import re

from engine.smtp.errors import ProtocolError
from engine.smtp.replies import SmtpReply

# RFC 5321 4.5.3.1.5 allows 512 octets; real servers send longer lines, so allow some slack.
MAX_REPLY_LINE = 2048  # octets, including the line ending
MAX_REPLY_LINES = 100

# Reply-code "-" / SP / nothing, then text (RFC 5321 4.2). Codes start with 2-5.
_REPLY_LINE = re.compile(rb"([2-5][0-5][0-9])(?:([ -])(.*))?", re.DOTALL)
# ehlo-keyword = (ALPHA / DIGIT) *(ALPHA / DIGIT / "-") (RFC 5321 4.1.1.1)
_EHLO_KEYWORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9-]*")
# Everything below 0x20, DEL, and the path delimiters; one of them in a path could end
# the command early or start another one.
_FORBIDDEN_IN_PATH = re.compile(r"[\x00-\x1f\x7f<>]")
_HELO_NAME = re.compile(r"[\x21-\x7e]+")
_LINE_ENDING = re.compile(rb"\r\n|\r|\n")


def parse_reply_line(raw: bytes) -> tuple[int, bool, str]:
    """``(code, is_last, text)`` of one reply line given without its line ending."""
    match = _REPLY_LINE.fullmatch(raw)
    if match is None:
        raise ProtocolError(f"malformed reply line {raw[:80]!r}")
    text = match[3] or b""
    if b"\r" in text:
        raise ProtocolError(f"bare CR in reply line {raw[:80]!r}")
    return int(match[1]), match[2] != b"-", text.decode("utf-8", "replace")


class ReplyParser:
    """Assembles complete replies from bytes arriving in arbitrary pieces.

    Memory stays bounded: a line longer than `MAX_REPLY_LINE` is refused as soon as the
    parser has seen that many octets without a line ending. Lines ending in a bare LF are
    accepted (being lenient in what we read costs nothing here).
    """

    def __init__(self) -> None:
        self._buffer = bytearray()
        self._code: int | None = None
        self._lines: list[str] = []
        self._eof = False

    def feed(self, data: bytes | bytearray) -> None:
        """Add received bytes; ``b""`` means the server closed the connection."""
        if data:
            self._buffer += data
        else:
            self._eof = True

    def clear(self) -> None:
        """Forget everything received so far (after STARTTLS: it was not encrypted)."""
        self._buffer.clear()
        self._code = None
        self._lines = []

    def next_reply(self) -> SmtpReply | None:
        """The next complete reply, or None until more bytes arrive."""
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) >= MAX_REPLY_LINE:
                    raise ProtocolError(f"reply line longer than {MAX_REPLY_LINE} octets")
                if self._eof:
                    raise ProtocolError("the server closed the connection without replying")
                return None
            if end + 1 > MAX_REPLY_LINE:
                raise ProtocolError(f"reply line longer than {MAX_REPLY_LINE} octets")
            raw = bytes(self._buffer[:end]).removesuffix(b"\r")
            del self._buffer[: end + 1]
            code, is_last, text = parse_reply_line(raw)
            if self._code is not None and code != self._code:
                raise ProtocolError(f"reply continued with code {code} after {self._code}")
            self._code = code
            self._lines.append(text)
            if len(self._lines) > MAX_REPLY_LINES:
                raise ProtocolError(f"reply of more than {MAX_REPLY_LINES} lines")
            if is_last:
                reply = SmtpReply(code, tuple(self._lines))
                self._code = None
                self._lines = []
                return reply


def parse_extensions(reply: SmtpReply) -> dict[str, str]:
    """The service extensions an EHLO reply offers: upper-case keyword -> its parameters.

    The first line is the server's name and greeting, not an extension. Lines that are not
    ehlo-lines (such as the obsolete ``AUTH=LOGIN``) are skipped.
    """
    extensions: dict[str, str] = {}
    for line in reply.lines[1:]:
        keyword, _, params = line.strip().partition(" ")
        if _EHLO_KEYWORD.fullmatch(keyword):
            extensions[keyword.upper()] = params.strip()
    return extensions


def check_path(address: str, *, allow_null: bool = False) -> str:
    """``address`` if it can go between ``<`` and ``>`` of MAIL or RCPT, else ValueError.

    The null reverse-path ``""`` (bounces) is allowed only where ``allow_null`` says so.
    """
    if not address and not allow_null:
        raise ValueError("an empty address is only allowed as the sender of a bounce")
    if _FORBIDDEN_IN_PATH.search(address):
        raise ValueError(f"address {address!r} contains a control character, '<' or '>'")
    return address


def check_helo_name(name: str) -> str:
    """``name`` if it can follow EHLO/HELO (a domain or address literal), else ValueError."""
    if not _HELO_NAME.fullmatch(name):
        raise ValueError(f"EHLO name {name!r} must be printable ASCII without spaces")
    return name


def to_crlf(data: bytes) -> bytes:
    """``data`` with every line ending (CRLF, a bare CR, a bare LF) made CRLF; ``data``
    itself, not a copy, when it has only CRLF already (what SMTP brought in: a large
    message is not held twice for nothing)."""
    crlf = data.count(b"\r\n")
    if data.count(b"\r") == crlf and data.count(b"\n") == crlf:
        return data
    return _LINE_ENDING.sub(b"\r\n", data)


def encode_message(data: bytes) -> bytes:
    """The DATA content to send for a message: CRLF line endings, dot-stuffed (RFC 5321
    4.5.2), a final CRLF if the message lacks one, then the terminating ``.`` line.
    """
    return b"".join(encode_message_parts(data))


def encode_message_parts(data: bytes) -> tuple[bytes, bytes]:
    """`encode_message` as the content and the end that follow each other on the wire:
    a large message is not copied once more only to append five octets (issue 28)."""
    body = to_crlf(data)
    if body.startswith(b"."):
        body = b"." + body
    body = body.replace(b"\r\n.", b"\r\n..")
    if body and not body.endswith(b"\r\n"):
        return body, b"\r\n.\r\n"
    return body, b".\r\n"


def header_end(data: bytes) -> int:
    """Where a message's header ends: the offset of the empty line's CRLF (the body follows
    it), or the length of a message that is all header. Lines end in CRLF."""
    if data.startswith(b"\r\n"):
        return 0
    end = data.find(b"\r\n\r\n")
    return len(data) if end < 0 else end + 2


def has_utf8_header(data: bytes) -> bool:
    """Whether a message's header has octets over 127: an internationalised header (RFC
    6532), which only an SMTPUTF8 transaction may carry (RFC 6531 3.2)."""
    return not data[: header_end(data)].isascii()
