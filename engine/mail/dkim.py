"""DKIM signatures (RFC 6376) for outgoing mail: rsa-sha256, or ed25519-sha256 (RFC 8463)
for a domain's second signature, relaxed/relaxed.

dkimpy is the verifier in the tests and folds the signature header; the signing itself is
done here for speed. The RSA signature is OpenSSL's (through `cryptography`, the key loaded
once per process, and computed without the GIL, so signing in a worker thread runs beside
the event loop), where dkimpy's pure-Python RSA takes ~7 ms a message for a 2048-bit key;
the relaxed canonicalisation of the header (`relaxed_header`) and of the body
(`relaxed_body`) work on whole byte strings, where dkimpy's line-by-line regular
expressions took ~0.35 ms a message and ~20 ms per MB of attachments (both are checked
against dkimpy's in the tests).

Rules: only the headers in `SIGNED_HEADERS` that the message has are signed (From always;
a message without one is refused), each in its last occurrence, and the signature is
prepended, so it covers exactly the bytes that follow it. A second signature (`sign` again
with another key) covers the same headers and not the first signature, so each verifies on
its own: a verifier that knows no Ed25519 still passes the RSA one (RFC 8463 6).
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Collection
from datetime import datetime
from functools import lru_cache

import dkim as dkimpy
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ed25519, padding, rsa, utils

# What a recipient sees and RFC 8058 requires to be signed (both List-Unsubscribe headers).
SIGNED_HEADERS: tuple[str, ...] = (
    "From",
    "To",
    "Cc",
    "Subject",
    "Date",
    "Message-ID",
    "Reply-To",
    "MIME-Version",
    "Content-Type",
    "List-Unsubscribe",
    "List-Unsubscribe-Post",
    # Gmail's feedback loop counts only a Feedback-ID its DKIM signature covers.
    "Feedback-ID",
    "List-Id",
)

_SIGNED_ORDER = tuple(name.lower().encode() for name in SIGNED_HEADERS)
_SIGNED_NAMES = frozenset(_SIGNED_ORDER)
_HEADER_NAME = b"DKIM-Signature"
_SIGNATURE_LINE = 72  # characters of b= per continuation line
_TAG_VALUE = re.compile(r"[a-z0-9](?:[a-z0-9._-]*[a-z0-9])?", re.IGNORECASE)
_WHITESPACE_RUN = re.compile(rb"[\t ]+")
_LINE_END = re.compile(rb"\r?\n")
_FIELD_NAME_OCTETS = bytes(range(0x21, 0x7F))  # what a field name is made of
_KEY_CACHE_SIZE = 4096  # distinct keys (sending domains) kept loaded


def sign(
    message: bytes,
    *,
    domain: str,
    selector: str,
    private_key_pem: str,
    timestamp: datetime | None = None,
) -> bytes:
    """The message with a DKIM-Signature header prepended.

    `message` is CRLF-terminated, as it will be sent; one that does not end in CRLF gets
    one, as SMTP DATA would add it. `private_key_pem` is an RSA key in PKCS#8 or PKCS#1
    PEM or an Ed25519 key in PKCS#8 PEM, as `engine.dkim_keys` makes them; it decides the
    algorithm. `timestamp`, when given, is recorded as the
    signature time (t=). Raises ValueError for a message without a From header or whose
    header does not parse, an unusable key, or a malformed domain or selector.
    """
    if not message.endswith(b"\r\n"):
        message += b"\r\n"
    end_of_header = message.find(b"\r\n\r\n")
    if end_of_header == -1:
        header_block, body_start = message, len(message)
    else:
        header_block, body_start = message[: end_of_header + 2], end_of_header + 4
    field = signature_field(
        header_block,
        message,
        body_start,
        domain=domain,
        selector=selector,
        private_key_pem=private_key_pem,
        timestamp=timestamp,
    )
    return field + message


def signature_field(
    header_block: bytes,
    data: bytes,
    body_start: int,
    *,
    domain: str,
    selector: str,
    private_key_pem: str,
    timestamp: datetime | None = None,
) -> bytes:
    """The DKIM-Signature header field (with its CRLF) that `sign` prepends, for a message
    whose header fields are `header_block` (each ending in CRLF, without the empty line)
    and whose body is `data` from `body_start` on (CRLF-terminated). Apart, so that a large
    message is signed where it lies and copied once, into what is sent (issue 28)."""
    for what, value in (("domain", domain), ("selector", selector)):
        if not _TAG_VALUE.fullmatch(value):
            raise ValueError(f"DKIM {what} {value!r} is malformed")
    key = load_private_key(private_key_pem)
    fields = relaxed_header(header_block, _SIGNED_NAMES)
    signed = [name for name in _SIGNED_ORDER if name in fields]
    if b"from" not in signed:
        raise ValueError("cannot sign a message without a From header")

    tags = [
        (b"v", b"1"),
        (b"a", b"ed25519-sha256" if isinstance(key, ed25519.Ed25519PrivateKey) else b"rsa-sha256"),
        (b"c", b"relaxed/relaxed"),
        (b"d", domain.lower().encode()),
        (b"s", selector.encode()),
    ]
    if timestamp is not None:
        tags.append((b"t", str(int(timestamp.timestamp())).encode()))
    body_hash = _body_hash(data, body_start)
    tags += [(b"h", b" : ".join(signed)), (b"bh", base64.b64encode(body_hash))]
    # Folded before hashing: what is hashed is the header exactly as sent, minus b='s value
    # (empty here), canonicalised like the others but without its CRLF (RFC 6376 3.7).
    unsigned: bytes = dkimpy.fold(
        b"; ".join(b"=".join(tag) for tag in tags) + b"; b=", namelen=len(_HEADER_NAME) + 2
    )
    hashed = b"".join(name + b":" + fields[name] + b"\r\n" for name in signed)
    hashed += b"dkim-signature:" + _relaxed_value(_LINE_END.sub(b"", b" " + unsigned))
    digest = hashlib.sha256(hashed).digest()
    if isinstance(key, ed25519.Ed25519PrivateKey):
        signature = key.sign(digest)  # PureEdDSA over the SHA-256 hash (RFC 8463 3)
    else:
        signature = key.sign(digest, padding.PKCS1v15(), utils.Prehashed(hashes.SHA256()))
    encoded = base64.b64encode(signature)
    # b= on continuation lines of its own: folding whitespace inside b= is ignored (RFC 6376
    # 3.5), so the signed prefix stays byte-for-byte what was hashed.
    folded = b"".join(
        b"\r\n " + encoded[i : i + _SIGNATURE_LINE] for i in range(0, len(encoded), _SIGNATURE_LINE)
    )
    return _HEADER_NAME + b": " + unsigned + folded + b"\r\n"


def relaxed_header(
    header_block: bytes, names: Collection[bytes] | None = None
) -> dict[bytes, bytes]:
    """Each field of a header block by lower-case name, its last occurrence's value in the
    relaxed canonical form (RFC 6376 3.4.2): unfolded, runs of white space made one space,
    none at either end. With `names` (lower-case), only the fields named there: signing
    canonicalises just what it signs.

    Parsed as dkimpy parses it (a line starting with white space continues a field, an mbox
    "From " line is skipped); ValueError for a line that is neither a field nor either of
    those. Byte-string operations rather than a regular expression per line and two per
    field: it runs for every message signed (2-8% of the delivery worker's time, profiled).
    """
    fields: dict[bytes, bytes] = {}
    name = b""
    value: list[bytes] = []
    # dkimpy ends a line at LF, with or without CR before it; a lone CR stays in the line.
    for line in header_block.replace(b"\r\n", b"\n").split(b"\n"):
        if not line:
            break
        if line[0] in (0x09, 0x20):
            value.append(line)
            continue
        colon = line.find(b":", 1)
        # A field name is one or more printable characters other than white space.
        if colon < 0 or line[:colon].translate(None, _FIELD_NAME_OCTETS):
            if line.startswith(b"From "):
                continue
            raise ValueError(f"cannot sign a malformed message: unexpected header line {line!r}")
        if name and (names is None or name in names):
            fields[name] = _relaxed_value(b"".join(value))
        name, value = line[:colon].lower(), [line[colon + 1 :]]
    if name and (names is None or name in names):
        fields[name] = _relaxed_value(b"".join(value))
    return fields


def _relaxed_value(value: bytes) -> bytes:
    """An unfolded field value in relaxed canonical form (line ends already removed):
    most values have no tab, run of spaces or line end, and need only the strip."""
    if b"\t" in value or b"  " in value:
        value = _WHITESPACE_RUN.sub(b" ", value)
    return value.strip()


def _body_hash(message: bytes, start: int) -> bytes:
    """The SHA-256 of the relaxed body of `message` (from `start`), without copying it when
    it needs no change but its trailing empty lines (base64 attachments never do): a large
    message is then hashed where it lies."""
    if any(message.find(run, start) >= 0 for run in (b"\t", b"  ", b" \r\n")):
        return hashlib.sha256(relaxed_body(message[start:])).digest()
    end = len(message)
    while end - 2 >= start and message.startswith(b"\r\n", end - 2):
        end -= 2
    hasher = hashlib.sha256(memoryview(message)[start:end])
    if end > start:
        hasher.update(b"\r\n")
    return hasher.digest()


def relaxed_body(body: bytes) -> bytes:
    """The relaxed canonical form of a CRLF-terminated body (RFC 6376 3.4.4).

    What dkimpy computes, at whole-body speed: its line-by-line regular expressions take
    ~20 ms per MB, which a message with attachments would spend on every send.
    """
    if b"\t" in body or b"  " in body:
        body = _WHITESPACE_RUN.sub(b" ", body)
    if b" \r\n" in body:  # after the above, at most one space ends a line
        body = body.replace(b" \r\n", b"\r\n")
    end = len(body)
    while end >= 2 and body.startswith(b"\r\n", end - 2):
        end -= 2
    return body[:end] + b"\r\n" if end else b""


@lru_cache(maxsize=_KEY_CACHE_SIZE)
def load_private_key(private_key_pem: str) -> rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey:
    """The RSA or Ed25519 key in a PEM, loaded once per process (loading an RSA key checks
    it, ~35 ms)."""
    try:
        key = serialization.load_pem_private_key(private_key_pem.encode(), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise ValueError(f"unusable DKIM private key: {exc}") from None
    if not isinstance(key, rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
        raise ValueError("DKIM private key is neither an RSA nor an Ed25519 key")
    return key
