"""Outgoing messages written by the stdlib `email` package: the reference writer.

`compose` (engine/mail/compose.py) writes the common shapes with the direct writer
(engine/mail/mime_writer.py) and everything else here; the two must give the same bytes for
what both handle (tests/test_delivery_mime.py), so this module is also the direct writer's
specification. Its header objects fold headers and RFC 2231-encode attachment names the
direct writer does not attempt.
"""

from __future__ import annotations

from collections.abc import Sequence
from email.message import MIMEPart
from email.policy import Policy
from typing import Any

from engine.mail.header_fields import ASCII_POLICY, UTF8_POLICY, header_text
from engine.mail.outgoing import Attachment, OutgoingMessage

Boundaries = tuple[str, str]
"""The multipart/mixed and multipart/alternative boundaries of one message."""


def write(
    message: OutgoingMessage,
    fields: Sequence[tuple[str, Any]],
    boundaries: Boundaries,
    policy: Policy,
) -> bytes:
    """The message with its header `fields` (name, value as assigned to a message)."""
    # A MIMEPart rather than an EmailMessage, whose parts would each repeat MIME-Version.
    msg = MIMEPart(policy=policy)
    for name, value in fields:
        msg[name] = value
    _set_body(msg, message, boundaries, policy)
    return msg.as_bytes()


def _set_body(
    msg: MIMEPart, message: OutgoingMessage, boundaries: Boundaries, policy: Policy
) -> None:
    """text/plain, text/html or multipart/alternative (text first); multipart/mixed around
    it when there are attachments."""
    present = bodies(message)
    mixed, alternative = boundaries
    if not message.attachments and len(present) == 1:
        body, subtype = present[0]
        msg.set_content(body, subtype=subtype)
        return
    if message.attachments:
        msg.make_mixed(boundary=mixed)
        if len(present) == 1:
            body, subtype = present[0]
            msg.attach(_text_part(policy, body, subtype))
        else:
            msg.attach(_alternative(MIMEPart(policy=policy), present, alternative, policy))
        for attachment in message.attachments:
            msg.attach(attachment_part(policy, attachment))
    else:
        _alternative(msg, present, alternative, policy)


def bodies(message: OutgoingMessage) -> list[tuple[str, str]]:
    """The message's bodies with their text/ subtypes, text first."""
    return [
        (body, subtype)
        for body, subtype in ((message.text, "plain"), (message.html, "html"))
        if body is not None
    ]


def _alternative(
    container: MIMEPart, present: list[tuple[str, str]], boundary: str, policy: Policy
) -> MIMEPart:
    container.make_alternative(boundary=boundary)
    for body, subtype in present:
        container.attach(_text_part(policy, body, subtype))
    return container


def _text_part(policy: Policy, body: str, subtype: str) -> MIMEPart:
    part = MIMEPart(policy=policy)
    part.set_content(body, subtype=subtype)
    return part


def attachment_part(policy: Policy, attachment: Attachment) -> MIMEPart:
    """One attachment as a base64 MIME part with its Content-Disposition."""
    filename = header_text("attachment filename", attachment.filename)
    maintype, subtype, params = content_type(
        header_text("attachment content type", attachment.content_type)
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


def content_type(value: str) -> tuple[str, str, dict[str, str]]:
    """The type, subtype and parameters of an attachment's content type.

    application/octet-stream when it does not parse, and for multipart/* and message/*:
    a multipart needs a boundary of its own and message/* may not be base64-encoded
    (RFC 2046 5.2), so such content travels as an opaque file.
    """
    header = ASCII_POLICY.header_factory("Content-Type", value)
    maintype: str = header.maintype
    if header.defects or maintype in ("multipart", "message"):
        return "application", "octet-stream", {}
    return maintype, header.subtype, dict(header.params)


def policy_for(smtputf8: bool) -> Policy:
    """The policy a message is written under: raw UTF-8 headers (RFC 6532) when an address
    needs SMTPUTF8, else RFC 2047 encoded words."""
    return UTF8_POLICY if smtputf8 else ASCII_POLICY
