"""Reading delivery status notifications (RFC 3464) and abuse reports (RFC 5965).

Pure parsing, no I/O: `parse` turns the bytes of a message that reached a bounce address
into a `Report`, or None when it is neither kind (an auto-reply, a human writing back);
the caller ties the report to its email through the bounce address, not through anything
the report quotes, which remote servers rewrite or redact.
"""

from __future__ import annotations

import email
import email.policy
import email.utils
import re
from dataclasses import dataclass
from email.message import Message

_STATUS = re.compile(r"([245])\.\d{1,3}\.\d{1,3}")


@dataclass(frozen=True, slots=True)
class RecipientStatus:
    """One per-recipient block of a DSN."""

    recipient: str
    action: str  # failed, delayed, delivered, relayed or expanded
    status: str  # the enhanced status code, e.g. 5.1.1
    diagnostic: str | None

    @property
    def permanent(self) -> bool:
        return self.action == "failed" and self.status.startswith("5.")

    @property
    def delayed(self) -> bool:
        return self.action == "delayed" or self.status.startswith("4.")


@dataclass(frozen=True, slots=True)
class Report:
    """A DSN (`kind` "dsn", `statuses`) or a complaint (`kind` "arf", `complainants`)."""

    kind: str
    statuses: tuple[RecipientStatus, ...] = ()
    feedback_type: str | None = None
    complainants: tuple[str, ...] = ()
    # A complaint's original message, as it quotes it: its Message-ID and its envelope
    # sender (Return-Path), which name the email when the report reached an address, such
    # as postmaster@, that does not (engine/forwarding/postmaster.py).
    original_message_id: str | None = None
    original_return_path: str | None = None


def _address(field: str | None) -> str | None:
    """The address of a typed field (`rfc822; user@example.com`) or a bare one."""
    if not field:
        return None
    value = field.partition(";")[2] if ";" in field else field
    value = value.strip().removeprefix("<").removesuffix(">").strip()
    return value.lower() if "@" in value else None


def _report_part(message: Message, subtype: str) -> Message | None:
    for part in message.walk():
        if part.get_content_type() == f"message/{subtype}":
            return part
    return None


def _inner(part: Message) -> list[Message]:
    """The messages (or header blocks) a message/* part holds."""
    payload = part.get_payload()
    return [p for p in payload if isinstance(p, Message)] if isinstance(payload, list) else []


def _dsn(part: Message) -> Report:
    blocks = _inner(part)
    statuses = []
    # The first block holds per-message fields; each later one describes one recipient.
    for block in blocks[1:]:
        recipient = _address(block.get("Final-Recipient")) or _address(
            block.get("Original-Recipient")
        )
        status = _STATUS.search(str(block.get("Status", "")))
        if recipient is None or status is None:
            continue
        diagnostic = block.get("Diagnostic-Code")
        statuses.append(
            RecipientStatus(
                recipient=recipient,
                action=str(block.get("Action", "")).strip().lower(),
                status=status.group(0),
                diagnostic=None if diagnostic is None else " ".join(str(diagnostic).split()),
            )
        )
    return Report("dsn", statuses=tuple(statuses))


def _original_headers(message: Message) -> Message | None:
    for part in message.walk():
        kind = part.get_content_type()
        if kind == "message/rfc822":
            inner = _inner(part)
            if inner:
                return inner[0]
        if kind == "text/rfc822-headers":
            text = part.get_payload(decode=True) or b""
            return email.message_from_bytes(bytes(text), policy=email.policy.compat32)
    return None


def _arf(message: Message, part: Message) -> Report:
    inner = _inner(part)
    fields = inner[0] if inner else part
    complainants = [a for a in (_address(v) for v in fields.get_all("Original-Rcpt-To") or []) if a]
    original = _original_headers(message)
    message_id = return_path = None
    if original is not None:
        for header in ("To", "Cc"):
            for _, address in email.utils.getaddresses(original.get_all(header) or []):
                if "@" in address:
                    complainants.append(address.lower())
        message_id = _field(original, "Message-ID")
        return_path = _field(original, "Return-Path")
    return Report(
        "arf",
        feedback_type=str(fields.get("Feedback-Type", "abuse")).strip().lower() or "abuse",
        complainants=tuple(dict.fromkeys(complainants)),
        original_message_id=message_id,
        original_return_path=return_path,
    )


def _field(headers: Message, name: str) -> str | None:
    value = " ".join(str(headers.get(name, "")).split())
    return value or None


def parse(data: bytes) -> Report | None:
    """The report a message carries, or None when it is not a DSN or an ARF report."""
    message = email.message_from_bytes(data, policy=email.policy.compat32)
    if message.get_content_type() != "multipart/report":
        return None
    report_type = str(message.get_param("report-type", "")).lower()
    if report_type == "delivery-status":
        part = _report_part(message, "delivery-status")
        return None if part is None else _dsn(part)
    if report_type == "feedback-report":
        part = _report_part(message, "feedback-report")
        return None if part is None else _arf(message, part)
    return None
