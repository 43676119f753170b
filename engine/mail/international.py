"""Internationalised message headers (RFC 6532): when a header may carry UTF-8, and how it
is made ASCII (RFC 2047) for a hop that does not take it. Pure functions, no I/O.

A header with octets over 127 is an internationalised one: it may travel only in an SMTPUTF8
transaction (RFC 6531 3.2), and only as UTF-8. Where SMTPUTF8 is not there (a client that
did not ask for it, a next hop that does not offer it) the header is `downgrade`d, field by
field, by what each field is (`FIELD_KINDS`, the rules as data):
- text (Subject, Comments, and fields we do not know, X-* ones included): RFC 2047 encoded
  words, each at most 75 characters (engine/mail/header_fields.py folds them);
- addresses (From, To, Cc, ...): display names as encoded words, domains as A-labels
  (IDNA); a non-ASCII local part has no ASCII form, so such a header cannot be downgraded;
- anything structured (Message-ID, References, Content-*, Received, ...): no ASCII form
  that means the same, so it cannot be downgraded either.
Fields that are ASCII already are kept byte for byte. Only the message's own header is read:
the header fields of MIME parts are body content (8BITMIME), not the message's header.

The doors (relay/connection.py) keep a message `as_received`: a UTF-8 header as it is in an
SMTPUTF8 transaction, downgraded outside one, refused when it is not UTF-8 or has no ASCII
form there. Delivery (engine/delivery/messages.py) builds the downgraded form beside the
UTF-8 one for hops that lack SMTPUTF8.
"""

from __future__ import annotations

import enum
from email.headerregistry import Address, Group

import idna

from engine.mail.header_fields import (
    ASCII_POLICY,
    UNSTRUCTURED,
    encoded_addresses,
    encoded_text,
    fold_field,
)
from engine.smtp.grammar import header_end


class CannotDowngrade(ValueError):
    """The header has UTF-8 that no ASCII form carries (`reason` says where)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class FieldKind(enum.Enum):
    TEXT = "text"  # unstructured: RFC 2047 encoded words anywhere
    ADDRESSES = "addresses"  # mailbox lists: encoded display names, A-label domains
    STRUCTURED = "structured"  # no ASCII form that means the same


FIELD_KINDS: dict[str, FieldKind] = {
    **dict.fromkeys(("subject", "comments", "keywords"), FieldKind.TEXT),
    **dict.fromkeys(
        (
            "from",
            "sender",
            "reply-to",
            "to",
            "cc",
            "bcc",
            "resent-from",
            "resent-sender",
            "resent-to",
            "resent-cc",
            "resent-bcc",
            "disposition-notification-to",
        ),
        FieldKind.ADDRESSES,
    ),
    **dict.fromkeys(
        (
            "date",
            "message-id",
            "in-reply-to",
            "references",
            "resent-date",
            "resent-message-id",
            "return-path",
            "received",
            "mime-version",
            "content-type",
            "content-transfer-encoding",
            "content-disposition",
            "content-id",
            "dkim-signature",
            "arc-seal",
            "arc-message-signature",
            "arc-authentication-results",
            "authentication-results",
            "list-unsubscribe",
            "list-unsubscribe-post",
            "list-id",
            "list-post",
            "list-help",
            "list-subscribe",
            "list-archive",
            "list-owner",
        ),
        FieldKind.STRUCTURED,
    ),
}


def header_problem(data: bytes) -> str | None:
    """Why an internationalised header is unusable as it is (not UTF-8), or None."""
    header = data[: header_end(data)]
    if header.isascii():
        return None
    try:
        header.decode("utf-8")
    except UnicodeDecodeError:
        return "the header has 8-bit octets that are not UTF-8 (RFC 6532)"
    return None


def as_received(data: bytes, smtputf8: bool) -> bytes:
    """A message as a door of ours keeps it, given whether it came in an SMTPUTF8
    transaction: its header must be UTF-8 if it is not ASCII; without SMTPUTF8 it is
    downgraded (a client that did not ask for an internationalised message gets the
    encoded form it should have sent). CannotDowngrade when it is refused."""
    problem = header_problem(data)
    if problem is not None:
        raise CannotDowngrade(problem)
    return data if smtputf8 else downgrade(data)


def downgrade(data: bytes) -> bytes:
    """The message with every header field ASCII (the body as it is); `data` itself when
    the header is ASCII already. CannotDowngrade when a field has no ASCII form."""
    end = header_end(data)
    if data[:end].isascii():
        return data
    problem = header_problem(data)
    if problem is not None:
        raise CannotDowngrade(problem)
    fields = [_downgraded(field) for field in _fields(data[:end])]
    return b"".join(fields) + data[end:]


def _fields(header: bytes) -> list[bytes]:
    """The header's fields, each with its continuation lines and final CRLF."""
    fields: list[bytes] = []
    for line in header.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t") and fields:
            fields[-1] += line
        else:
            fields.append(line)
    return fields


def _downgraded(field: bytes) -> bytes:
    if field.isascii():
        return field
    name, colon, value = field.decode("utf-8").partition(":")
    if not colon:
        raise CannotDowngrade("the header has a line that is not a field")
    name = name.strip()
    # Unfolded (RFC 5322 2.2.3): folding is redone for the encoded form.
    text = value.replace("\r\n", "").strip()
    kind = FIELD_KINDS.get(name.lower(), FieldKind.TEXT)
    if kind is FieldKind.STRUCTURED:
        raise CannotDowngrade(f"the {name} field has UTF-8 that has no ASCII form")
    if kind is FieldKind.TEXT:  # encoded words already in it are read, then made anew
        ascii = encoded_text(name, str(UNSTRUCTURED(name, text)))
    else:
        ascii = encoded_addresses(name, _ascii_addresses(name, text))
    return fold_field(name, ascii).encode("ascii")


def _ascii_addresses(name: str, text: str) -> list[Address | Group]:
    """The mailboxes and groups of an address field, with A-label domains; CannotDowngrade
    for a non-ASCII local part."""
    parsed = ASCII_POLICY.header_factory(name, text)
    found: list[Address | Group] = []
    for group in parsed.groups:
        boxes = [_ascii_address(name, box) for box in group.addresses]
        if group.display_name is None:
            found.extend(boxes)
        else:
            found.append(Group(group.display_name, boxes))
    if not found:
        raise CannotDowngrade(f"the {name} field cannot be read as addresses")
    return found


def _ascii_address(name: str, box: Address) -> Address:
    if not box.username.isascii():
        raise CannotDowngrade(
            f"the {name} field has an address with a non-ASCII local part, which only "
            "SMTPUTF8 can carry"
        )
    domain = box.domain
    if not domain.isascii():
        try:
            domain = idna.encode(domain.lower(), uts46=True).decode("ascii")
        except (idna.IDNAError, UnicodeError) as exc:
            raise CannotDowngrade(f"the {name} field has a domain that is not IDNA") from exc
    return Address(box.display_name, username=box.username, domain=domain)
