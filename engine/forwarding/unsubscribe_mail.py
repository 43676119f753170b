"""Unsubscribe requests sent by email: the mailto: alternative of List-Unsubscribe.

Mail that offers unsubscribe lists `mailto:unsubscribe+<email id>@<its bounce domain>?subject=
<token>` beside its one-click URL (engine/sending/tracking.py). The inbound MX accepts that
address while the email exists, as it accepts the email's bounce address, and a message to it
unsubscribes the recipient the token in its Subject names: the same sealed token as the URL's,
which cannot be forged and names a recipient of that email only. A mail client that dropped
the subject still unsubscribes the email's recipient when the email had one only (as every
broadcast email has); otherwise the message is refused (550), since it does not say who.

The MX's hook (engine/forwarding/inbound.py): `accepts` at RCPT, `requests` read before the
message's unit of work, `record` inside it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from email.parser import BytesHeaderParser
from email.policy import default

from engine.mail.addresses import email_id_from_unsubscribe_address
from engine.platform.errors import InvalidRequest
from engine.platform.runtime import Runtime
from engine.sending import tracking
from storage import emails
from storage.tx import Tx

# A sealed token: base64url, far longer than any word of a subject a person writes.
_TOKEN = re.compile(r"[A-Za-z0-9_-]{40,}")


@dataclass(frozen=True, slots=True)
class Request:
    email_id: str
    recipient: str | None  # None: the subject named nobody; the email's only recipient


async def accepts(rt: Runtime, address: str) -> bool | None:
    """Whether an unsubscribe address is taken (its email exists); None when `address` is
    not an unsubscribe address."""
    email_id = email_id_from_unsubscribe_address(address)
    if email_id is None:
        return None
    return bool(await rt.db.read(emails.by_ids, [email_id]))


def requests(secret: str, recipients: list[str], data: bytes) -> list[Request]:
    """The unsubscribe requests a message to `recipients` makes (none when it is to no
    unsubscribe address); pure, no database."""
    email_ids = sorted({i for i in map(email_id_from_unsubscribe_address, recipients) if i})
    if not email_ids:
        return []
    subject = str(BytesHeaderParser(policy=default).parsebytes(data).get("Subject") or "")
    named: dict[str, str] = {}
    for word in _TOKEN.findall(subject):
        found = tracking.unsubscribe_request(secret, word)
        if found is not None:
            named.setdefault(*found)
    return [Request(email_id, named.get(email_id)) for email_id in email_ids]


def record(tx: Tx, asked: list[Request], now: datetime) -> None:
    """Unsubscribe the recipients the requests name, in the message's unit of work;
    InvalidRequest (the MX refuses the message) when one names nobody it can tell."""
    for request in asked:
        recipient = request.recipient
        if recipient is None:
            everyone = emails.recipients_of(tx, request.email_id)
            if len(everyone) != 1:
                raise InvalidRequest(
                    "the unsubscribe request does not say who: send it with the subject as given"
                )
            recipient = everyone[0].address
        tracking.record_unsubscribe(tx, request.email_id, recipient, "mailto", now)
