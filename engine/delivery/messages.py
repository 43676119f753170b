"""Turning a stored email into the signed bytes that go on the wire (pure, CPU-bound).

Composition and DKIM signing run in a worker thread, one hop for a whole batch of emails.
An email submitted as a complete message (SMTP relay, forwards: `Email.raw`) is not
composed: it goes out as given, only signed and completed (`as_given`). A message whose
header has UTF-8 is built twice, as it is and downgraded, each signed (`WireMessage.for_hop`
picks one per next hop).

An email that offers unsubscribe (`Email.unsubscribe`: broadcasts, and emails whose sender
asked) is built once per recipient: each copy's List-Unsubscribe (one-click URL and mailto:),
`{{unsubscribe_url}}` and footer (engine/mail/unsubscribe_footer.py) and tracking links name
that recipient alone, so a Cc recipient's unsubscribe is the Cc recipient's. Other emails
are one message for all their recipients at a domain, with no List-Unsubscribe.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence
from dataclasses import dataclass
from email.utils import format_datetime

from engine.domains import tracking_host
from engine.domains.bounce_domain import envelope_domain
from engine.mail import arc
from engine.mail.addresses import bounce_address
from engine.mail.compose import Attachment, OutgoingMessage, compose
from engine.mail.dkim import sign, signature_field
from engine.mail.international import CannotDowngrade, downgrade
from engine.mail.text_part import from_html
from engine.mail.unsubscribe_footer import DEFAULT, Footer, personal_html, personal_text
from engine.sending.tracking import Links, instrument_html
from engine.smtp.grammar import has_utf8_header, header_end, to_crlf
from storage.domains import Domain
from storage.emails import Email

_UNFOLDED = re.compile(r"\r\n(?![ \t])")  # where one header field ends and the next begins


@dataclass(frozen=True, slots=True)
class WireMessage:
    """A built message. One whose header has UTF-8 (RFC 6532) goes as it is only to a hop
    that offers SMTPUTF8; for the others it carries its downgraded header (RFC 2047,
    engine/mail/international.py), signed on its own, that replaces `data`'s first
    `header_length` octets; None when the header has no ASCII form."""

    email_id: str
    envelope_from: str
    data: bytes
    # The one recipient this copy is for; None: every recipient of the email.
    recipient: str | None = None
    ascii_header: bytes | None = None
    header_length: int = 0

    def asks_no_tls_policy(self) -> bool:
        """Whether its sender set `TLS-Required: No` (RFC 8689 5): deliver it even where the
        recipient domain's TLS policy (MTA-STS, DANE) would pass every host over."""
        header = self.data[: header_end(self.data)].decode("ascii", "replace")
        for field in _UNFOLDED.split(header):
            name, colon, value = field.partition(":")
            if colon and name.strip().lower() == "tls-required":
                return value.strip().lower() == "no"
        return False

    def for_hop(self, smtputf8: bool) -> bytes:
        """What to send to a server that offers SMTPUTF8 (`smtputf8`) or does not: `data`,
        or its downgraded form; `data` when there is none (the session refuses that
        locally with 5.6.7 rather than send a UTF-8 header raw)."""
        if smtputf8 or self.ascii_header is None:
            return self.data
        return self.ascii_header + self.data[self.header_length :]


def _international(
    email_id: str, envelope_from: str, data: bytes, ascii: bytes, recipient: str | None
) -> WireMessage:
    """A message with a UTF-8 header and its downgraded, signed form `ascii`: only the
    latter's header is kept when the two bodies are the same (a large message is not held
    twice), else the whole of it."""
    length, cut = header_end(data), header_end(ascii)
    if memoryview(ascii)[cut:] == memoryview(data)[length:]:
        return WireMessage(email_id, envelope_from, data, recipient, ascii[:cut], length)
    return WireMessage(email_id, envelope_from, data, recipient, ascii, len(data))


def _wire(
    email_id: str,
    envelope_from: str,
    data: bytes,
    unsigned: bytes,
    domain: Domain,
    recipient: str | None = None,
) -> WireMessage:
    """The wire message of signed `data`, made from `unsigned`; with the downgraded form
    when its header has UTF-8."""
    if not has_utf8_header(data):
        return WireMessage(email_id, envelope_from, data, recipient)
    try:
        ascii = signed(downgrade(unsigned), domain)
    except CannotDowngrade:
        return WireMessage(email_id, envelope_from, data, recipient)
    return _international(email_id, envelope_from, data, ascii, recipient)


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


def build(
    email: Email,
    domain: Domain,
    link_settings: LinkSettings,
    footer: Footer = DEFAULT,
    recipients: Sequence[str] = (),
) -> list[WireMessage]:
    """The DKIM-signed messages of an email and its per-email bounce address (on the
    domain's bounce domain once that is in use, engine/domains/bounce_domain.py): one for
    all its recipients, or, when it offers unsubscribe, one for each of `recipients`."""
    bounce = bounce_address(email.id, envelope_domain(domain))
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
        return [_wire(email.id, bounce, signed(given, domain), given, domain)]
    if email.raw is not None:
        data = _signed_as_given(email, domain)
        if not has_utf8_header(data):  # as given: the unsigned form only when needed
            return [WireMessage(email.id, bounce, data)]
        return [_wire(email.id, bounce, data, as_given(email), domain)]
    # The domain's own tracking host once it points here (engine/domains/tracking_host.py).
    link_base = tracking_host.link_base(link_settings.public_url, domain)
    if not email.unsubscribe:
        links = Links(link_base, link_settings.secret, email.id, str(email.to[0]["email"]))
        unsigned = compose(_outgoing(email, domain, links, None, footer))
        return [_wire(email.id, bounce, signed(unsigned, domain), unsigned, domain)]
    built = []
    for recipient in dict.fromkeys(recipients):
        links = Links(link_base, link_settings.secret, email.id, recipient)
        unsigned = compose(_outgoing(email, domain, links, bounce, footer))
        built.append(_wire(email.id, bounce, signed(unsigned, domain), unsigned, domain, recipient))
    return built


def _outgoing(
    email: Email, domain: Domain, links: Links, bounce: str | None, footer: Footer
) -> OutgoingMessage:
    """The message of an email for the reader `links` name; with unsubscribe when `bounce`
    (the email's bounce address, beside which the mailto: address is) is given."""
    html = email.html
    if html is not None and (domain.open_tracking or domain.click_tracking):
        html = instrument_html(
            html, links, opens=domain.open_tracking, clicks=domain.click_tracking
        )
    # HTML alone gets a text part made from it (before tracking rewrote its links).
    text = email.text if email.text is not None or email.html is None else from_html(email.html)
    one_click = mailto = None
    if bounce is not None:
        one_click, mailto = links.unsubscribe(bounce)
        # After tracking: the unsubscribe link is never routed through a click redirect.
        text = personal_text(text, one_click, footer)
        html = personal_html(html, one_click, footer)
    return OutgoingMessage(
        from_address=email.from_address,
        from_name=email.from_name,
        to=tuple(_mailbox(e) for e in email.to),
        cc=tuple(_mailbox(e) for e in email.cc),
        reply_to=None if email.reply_to is None else _mailbox(email.reply_to),
        subject=email.subject,
        text=text,
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
        list_unsubscribe=one_click,
        list_unsubscribe_mailto=mailto,
    )


@dataclass(frozen=True, slots=True)
class ToBuild:
    """An email of a round, with what its messages are built from."""

    email: Email
    domain: Domain | None  # None: the sending domain was deleted
    footer: Footer
    recipients: Sequence[str]  # the round's recipients of it


def build_all(
    emails: Sequence[ToBuild], link_settings: LinkSettings
) -> dict[str, list[WireMessage] | str]:
    """Every message of a batch; an email that cannot be built maps to the reason why."""
    built: dict[str, list[WireMessage] | str] = {}
    for item in emails:
        email, domain = item.email, item.domain
        if domain is None:
            built[email.id] = "the sending domain was deleted"
            continue
        try:
            built[email.id] = build(email, domain, link_settings, item.footer, item.recipients)
        except Exception as exc:  # stored data no code can build from: fails that email only
            built[email.id] = f"cannot build the message: {type(exc).__name__}: {exc}"
    return built
