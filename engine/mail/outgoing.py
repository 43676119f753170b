"""An outgoing message as data: what the headers and body of one email are made of, before
engine/mail/compose.py writes it (with engine/mail/mime_writer.py or mime_package.py, which
read these types too, so they stand apart from all three).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from engine.mail.header_fields import Mailbox


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
    # The header the tags go out in; None keeps them internal (they are the sender's labels
    # for its own reports, not something to show recipients and their filters).
    tags_header: str | None = None
    list_unsubscribe: str | None = None  # one-click (RFC 8058) unsubscribe URL
    # Its mailto: alternative (RFC 2369), listed after it; only beside the URL.
    list_unsubscribe_mailto: str | None = None

    @property
    def needs_smtputf8(self) -> bool:
        """Whether an address in the headers is non-ASCII, so the next hop must offer SMTPUTF8.

        Such a message carries its headers as raw UTF-8 (RFC 6532) instead of RFC 2047.
        """
        addresses = [self.from_address, *(email for email, _ in (*self.to, *self.cc))]
        if self.reply_to is not None:
            addresses.append(self.reply_to[0])
        return not all(address.isascii() for address in addresses)
