"""Message composition: outgoing emails as MIME bytes, their identifiers, and DKIM signing.

All of it is pure (no I/O, no clock): the delivery path composes and signs in memory.
"""

from engine.mail.addresses import bounce_address, email_id_from_bounce_address, message_id
from engine.mail.compose import (
    STRUCTURAL_HEADERS,
    Attachment,
    Mailbox,
    OutgoingMessage,
    compose,
    validate_custom_headers,
)
from engine.mail.dkim import sign

__all__ = [
    "STRUCTURAL_HEADERS",
    "Attachment",
    "Mailbox",
    "OutgoingMessage",
    "bounce_address",
    "compose",
    "email_id_from_bounce_address",
    "message_id",
    "sign",
    "validate_custom_headers",
]
