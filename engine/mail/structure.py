"""Bounds on a received message's structure, checked before anything parses it.

A message of 20,000 header fields or 2,000 nested MIME parts costs a parser (the email
package, ours) far more memory than its size; one from a stranger must be refused before
any parser sees it. `problem` walks the message's header sections and MIME boundaries
itself, with byte searches (no parse tree, no recursion), and names the first bound broken;
the SMTP listeners refuse such a message with 554 5.6.0 and that sentence.

The bounds (docs/decisions.md): at most `MAX_HEADER_FIELDS` fields in any one header
section (Postfix refuses a header field over 100 KiB and over 50 Received fields; real mail
has under 100 fields); MIME nesting at most `MAX_MIME_DEPTH` deep (Postfix allows 100; mail
clients write 3 or 4, a forward of a forward adds one each); at most `MAX_MIME_PARTS` parts.
"""

from __future__ import annotations

import re

MAX_HEADER_FIELDS = 1000
MAX_MIME_DEPTH = 32
MAX_MIME_PARTS = 1000

_BOUNDARY = re.compile(rb'boundary\s*=\s*(?:"([^"\r\n]{1,200})"|([^\s;"]{1,200}))', re.I)


def _header(data: bytes, start: int) -> tuple[int, int, bytes]:
    """The header section at `start`: where its body starts, its field count, and its
    Content-Type value (b"" if none). Stops counting past `MAX_HEADER_FIELDS`."""
    fields = 0
    content_type = b""
    in_content_type = False
    pos = start
    while pos < len(data):
        end = data.find(b"\r\n", pos)
        if end < 0:
            end = len(data)
        line = data[pos:end]
        pos = end + 2
        if not line:
            break
        if line[:1] in (b" ", b"\t"):
            if in_content_type:
                content_type += line
            continue
        fields += 1
        if fields > MAX_HEADER_FIELDS:
            break
        in_content_type = line[:13].lower() == b"content-type:"
        if in_content_type:
            content_type = line[13:]
    return min(pos, len(data)), fields, content_type


def _kind(content_type: bytes) -> tuple[str, bytes | None]:
    """("multipart", boundary), ("message", None) for message/rfc822, or ("leaf", None)."""
    media = content_type.split(b";", 1)[0].strip().lower()
    if media.startswith(b"multipart/"):
        found = _BOUNDARY.search(content_type)
        if found is not None:
            return "multipart", found[1] or found[2]
    elif media == b"message/rfc822":
        return "message", None
    return "leaf", None


def problem(data: bytes) -> str | None:
    """Which bound the message breaks, as a sentence, or None when it keeps them all."""
    # Each open level: the boundary of a multipart, or None for an enclosed message.
    levels: list[bytes | None] = []
    parts = 0
    start = 0
    while True:  # the top header, then any message/rfc822 directly inside it
        body, fields, content_type = _header(data, start)
        if fields > MAX_HEADER_FIELDS:
            return f"the message has more than {MAX_HEADER_FIELDS} header fields"
        kind, boundary = _kind(content_type)
        if kind == "leaf":
            break
        levels.append(boundary)
        if len(levels) > MAX_MIME_DEPTH:
            return f"the message's MIME parts nest more than {MAX_MIME_DEPTH} deep"
        if kind == "multipart":
            break
        start = body
    # A delimiter line is "--" boundary at the start of a line (the CRLF before it belongs
    # to the delimiter; the first one may follow the header's empty line directly).
    found = max(0, body - 2) - 1
    while levels and (found := data.find(b"\r\n--", found + 1)) >= 0:
        line_start = found + 4
        line_end = data.find(b"\r\n", line_start)
        line = data[line_start : len(data) if line_end < 0 else line_end].rstrip(b" \t")
        level = next(
            (i for i in range(len(levels) - 1, -1, -1) if _opens(levels[i], line)),
            None,
        )
        if level is None:
            continue  # a line of content that happens to start with "--"
        boundary = levels[level]
        assert boundary is not None
        del levels[level + 1 :]  # inner parts end where an outer delimiter comes
        if line == boundary + b"--":
            levels.pop()
            continue
        parts += 1
        if parts > MAX_MIME_PARTS:
            return f"the message has more than {MAX_MIME_PARTS} MIME parts"
        start = len(data) if line_end < 0 else line_end + 2
        while True:  # the part's header, then any message/rfc822 directly inside it
            start, fields, content_type = _header(data, start)
            if fields > MAX_HEADER_FIELDS:
                return f"a MIME part has more than {MAX_HEADER_FIELDS} header fields"
            kind, inner = _kind(content_type)
            if kind == "leaf":
                break
            levels.append(inner)
            if len(levels) > MAX_MIME_DEPTH:
                return f"the message's MIME parts nest more than {MAX_MIME_DEPTH} deep"
            if kind == "multipart":
                break
    return None


def _opens(boundary: bytes | None, line: bytes) -> bool:
    return boundary is not None and (line == boundary or line == boundary + b"--")
