"""The sandbox's mailbox: what sandboxed workspaces sent, as the recipients would have got it.

Lists read only the summary of each captured message; one message is read with its bytes
and taken apart here (header fields, the text and HTML parts) for the API and the console.
"""

from __future__ import annotations

import email.policy
from dataclasses import dataclass
from email.message import EmailMessage
from email.parser import BytesParser

from engine.platform.errors import NotFound
from engine.platform.runtime import Principal, Runtime
from storage import sandbox
from storage.sandbox import Captured

_PARSER = BytesParser(policy=email.policy.default)


@dataclass(frozen=True, slots=True)
class CapturedMessage:
    """One captured message, taken apart."""

    captured: Captured
    headers: list[tuple[str, str]]
    text: str | None
    html: str | None
    source: bytes


async def page(
    rt: Runtime, who: Principal, email_id: str | None, page_number: int, limit: int
) -> tuple[list[Captured], int]:
    """Captured messages newest first (of one email, when given), and the total."""
    return await rt.db.read(
        sandbox.messages_page, who.workspace_id, email_id, page_number * limit, limit
    )


def _part(message: EmailMessage, subtype: str) -> str | None:
    part = message.get_body(preferencelist=(subtype,))
    if part is None:
        return None
    try:
        content = part.get_content()
    except (LookupError, ValueError):  # an unknown charset: show what can be read
        payload = part.get_payload(decode=True)
        return payload.decode("utf-8", "replace") if isinstance(payload, bytes) else None
    return content if isinstance(content, str) else None


def read(captured: Captured) -> CapturedMessage:
    """A captured message (loaded with its bytes) taken apart."""
    data = captured.data or b""
    message = _PARSER.parsebytes(data)
    assert isinstance(message, EmailMessage)
    headers = [(name, str(value)) for name, value in message.items()]
    return CapturedMessage(captured, headers, _part(message, "plain"), _part(message, "html"), data)


async def message(rt: Runtime, who: Principal, message_id: str) -> CapturedMessage:
    found = await rt.db.read(sandbox.message, who.workspace_id, message_id)
    if found is None:
        raise NotFound("captured message not found")
    return read(found)
