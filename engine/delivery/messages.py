"""Turning a stored email into the signed bytes that go on the wire (pure, CPU-bound).

Composition and DKIM signing run in a worker thread, one hop for a whole batch of emails.
An email submitted as a complete message (SMTP relay, forwards: `Email.raw`) is not
composed: it goes out as given, only signed and completed (`as_given`).
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import format_datetime

from engine.domains import tracking_host
from engine.mail import arc
from engine.mail.addresses import bounce_address
from engine.mail.compose import Attachment, OutgoingMessage, compose
from engine.mail.dkim import sign, signature_field
from engine.mail.text_part import from_html
from engine.sending.tracking import Links, instrument_html
from engine.smtp.grammar import to_crlf
from storage.domains import Domain
from storage.emails import Email


@dataclass(frozen=True, slots=True)
class WireMessage:
    email_id: str
    envelope_from: str
    data: bytes


def _mailbox(entry: dict[str, str | None]) -> tuple[str, str | None]:
    return str(entry["email"]), entry.get("name")


@dataclass(frozen=True, slots=True)
class LinkSettings:
    """What building a message needs of the service: its public URL and link secret, and
    its host name (the authserv-id of the results its MX writes, which ARC carries on)."""

    public_url: str
    secret: str
    authserv_id: str


def as_given(email: Email) -> bytes:
    """An email's submitted message as it goes out: CRLF line endings, Message-ID and Date
    added only if missing, Bcc header fields removed (RFC 6409 8.1: they name recipients
    the others must not see); otherwise byte for byte what was submitted.
    """
    header, data, start = _given(email)
    return b"".join([header, memoryview(data)[start:]])  # the body copied once


def _given(email: Email) -> tuple[bytes, bytes, int]:
    """`as_given` in two: the header fields as they go out, and the submitted data whose
    octets from the offset returned follow them (the empty line and the body), uncopied."""
    if email.raw is None:
        raise ValueError("the email has no submitted message")
    data = to_crlf(email.raw)
    end = data.find(b"\r\n\r\n")
    header, start = (data, len(data)) if end < 0 else (data[: end + 2], end + 2)
    kept: list[bytes] = []
    names: set[bytes] = set()
    dropping = False
    for line in header.splitlines(keepends=True):
        if line[:1] in (b" ", b"\t"):
            if not dropping:
                kept.append(line)
            continue
        name = line.split(b":", 1)[0].strip().lower()
        names.add(name)
        dropping = name == b"bcc"
        if not dropping:
            kept.append(line)
    added = []
    if b"message-id" not in names:
        added.append(f"Message-ID: {email.message_id}\r\n".encode())
    if b"date" not in names:
        added.append(f"Date: {format_datetime(email.created_at)}\r\n".encode())
    # At the end of the header, as an MSA completes a message (Postfix does the same): a
    # Message-ID above the client's Received field reads as added by a relay to filters
    # (SpamAssassin's MSGID_FROM_MTA_HEADER).
    if added and kept and not kept[-1].endswith(b"\r\n"):  # a header-only message
        kept[-1] += b"\r\n"
    return b"".join([*kept, *added]), data, start


def _signed_as_given(email: Email, domain: Domain) -> bytes:
    """`signed(as_given(email), domain)`, with the submitted message copied once: the
    signatures are made over its header and body where they lie (a 34 MiB message was
    held three times over, issue 28). A message without a body or without a final CRLF
    takes the long way, where signing adds what it lacks."""
    header, data, start = _given(email)
    if start >= len(data) or not data.endswith(b"\r\n"):
        return signed(as_given(email), domain)
    keys = [(domain.dkim_selector, domain.dkim_private_key)]
    if domain.ed25519_signing and domain.ed25519_selector and domain.ed25519_private_key:
        keys.append((domain.ed25519_selector, domain.ed25519_private_key))
    # Each signature covers the same fields and not the others; the last made goes first.
    fields = [
        signature_field(
            header, data, start + 2, domain=domain.name, selector=selector, private_key_pem=pem
        )
        for selector, pem in reversed(keys)
    ]
    return b"".join([*fields, header, memoryview(data)[start:]])


def signed(message: bytes, domain: Domain) -> bytes:
    """A message signed with the domain's RSA key, and with its Ed25519 key too when the
    domain signs with it (RFC 8463: two signatures, each verifying on its own)."""
    message = sign(
        message,
        domain=domain.name,
        selector=domain.dkim_selector,
        private_key_pem=domain.dkim_private_key,
    )
    if domain.ed25519_signing and domain.ed25519_selector and domain.ed25519_private_key:
        message = sign(
            message,
            domain=domain.name,
            selector=domain.ed25519_selector,
            private_key_pem=domain.ed25519_private_key,
        )
    return message


def build(email: Email, domain: Domain, link_settings: LinkSettings) -> WireMessage:
    """The DKIM-signed message of an email, and its per-email bounce address."""
    if email.raw is not None and email.source == "forward" and len(email.raw) <= arc.MAX_SIZE:
        # ARC-sealed as it goes out (engine/mail/arc.py), then signed: the seal carries
        # the results our MX found on arrival. Small enough for the copies this makes.
        given = arc.sealed(
            as_given(email),
            domain=domain.name,
            selector=domain.dkim_selector,
            private_key_pem=domain.dkim_private_key,
            authserv_id=link_settings.authserv_id,
            timestamp=email.created_at,
        )
        return WireMessage(email.id, bounce_address(email.id, domain.name), signed(given, domain))
    if email.raw is not None:
        data = _signed_as_given(email, domain)
        return WireMessage(email.id, bounce_address(email.id, domain.name), data)
    links = Links(
        tracking_host.link_base(link_settings.public_url, domain),
        link_settings.secret,
        email.id,
        str(email.to[0]["email"]),
    )
    html = email.html
    if html is not None and (domain.open_tracking or domain.click_tracking):
        html = instrument_html(
            html, links, opens=domain.open_tracking, clicks=domain.click_tracking
        )
    outgoing = OutgoingMessage(
        from_address=email.from_address,
        from_name=email.from_name,
        to=tuple(_mailbox(e) for e in email.to),
        cc=tuple(_mailbox(e) for e in email.cc),
        reply_to=None if email.reply_to is None else _mailbox(email.reply_to),
        subject=email.subject,
        # HTML alone gets a text part made from it (before tracking rewrote its links).
        text=email.text if email.text is not None or email.html is None else from_html(email.html),
        html=html,
        headers=tuple(email.headers.items()),
        attachments=tuple(
            Attachment(a["filename"], a["content_type"], base64.b64decode(a["content_base64"]))
            for a in email.attachments
        ),
        message_id=email.message_id,
        date=email.created_at,
        tags=tuple(email.tags),
        tags_header=domain.tags_header,
        list_unsubscribe=links.unsubscribe,
    )
    data = signed(compose(outgoing), domain)
    return WireMessage(email.id, bounce_address(email.id, domain.name), data)


def build_all(
    pairs: Sequence[tuple[Email, Domain | None]], link_settings: LinkSettings
) -> dict[str, WireMessage | str]:
    """Every message of a batch; an email that cannot be built maps to the reason why."""
    built: dict[str, WireMessage | str] = {}
    for email, domain in pairs:
        if domain is None:
            built[email.id] = "the sending domain was deleted"
            continue
        try:
            built[email.id] = build(email, domain, link_settings)
        except Exception as exc:  # stored data no code can build from: fails that email only
            built[email.id] = f"cannot build the message: {type(exc).__name__}: {exc}"
    return built
