"""Broadcasts as tests set them up: the sender to send from, a send's body, a broadcast row left
sending by a node, and reading the messages they send."""

from __future__ import annotations

import email
import email.policy
import uuid
from datetime import datetime
from email.message import EmailMessage
from typing import Any

from storage.broadcasts import Broadcast
from tests.harness.service import Account


async def sender_id(account: Account) -> str:
    senders: list[dict[str, Any]] = (await account.client.get("/v1/senders/")).json()
    return str(senders[0]["id"])


def body(list_id: str, sender: str, **extra: Any) -> dict[str, Any]:
    payload = {
        "contact_list_id": list_id,
        "sender_address_id": sender,
        "subject": "Hello {{name}}, your {{plan}} plan",
        "html": "<p>Dear {{ name }}, code {{code}} for {{email}}.{{unknown}}</p>",
        "text": "Dear {{name}}, code {{code}} for {{email}}.{{unknown}}",
        "tags": ["news"],
    }
    payload.update(extra)
    return payload


def parsed(data: bytes) -> EmailMessage:
    message = email.message_from_bytes(data, policy=email.policy.default)
    assert isinstance(message, EmailMessage)
    return message


def part(message: EmailMessage, subtype: str) -> str:
    found = message.get_body(preferencelist=(subtype,))
    assert found is not None
    content: str = found.get_content()
    return content


def left_sending(account: Account, node: str, now: datetime) -> Broadcast:
    """A broadcast row as a node leaves it while sending (tests put it in place directly)."""
    return Broadcast(
        id=str(uuid.uuid4()),
        workspace_id=account.workspace_id,
        contact_list_id=str(uuid.uuid4()),
        sender_id=str(uuid.uuid4()),
        domain_id=str(uuid.uuid4()),
        from_address="news@example.org",
        name="Half done",
        tags=[],
        status="sending",
        queued=40,
        skipped=2,
        reserved=100,
        node=node,
        failure_reason=None,
        created_at=now,
        updated_at=now,
        finished_at=None,
    )
