"""Outgoing messages built without a service: a base message to vary field by field, and a
resolver that publishes a DKIM key as the domain's DNS would."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from engine.domains.dkim_keys import DkimKey, txt_value
from engine.mail import OutgoingMessage

DATE = datetime(2024, 5, 1, 12, 30, 5, tzinfo=UTC)
DOMAIN = "mail.example.com"


def make(**changes: Any) -> OutgoingMessage:
    base = OutgoingMessage(
        from_address="ada@mail.example.com",
        from_name="Ada Lovelace",
        to=(("bob@example.org", "Bob"),),
        subject="Your receipt",
        text="Thanks for your order.\n",
        message_id="<0b7a7d2e-4b1c-4d5e-9f10-2a3b4c5d6e7f@mail.example.com>",
        date=DATE,
    )
    return dataclasses.replace(base, **changes)


def dns_for(key: DkimKey, domain: str = DOMAIN) -> Callable[..., bytes | None]:
    """A resolver that publishes the key's TXT record, as the domain's DNS would."""

    def txt(name: bytes, timeout: float = 5) -> bytes | None:
        if name.rstrip(b".") == f"{key.selector}._domainkey.{domain}".encode():
            return txt_value(key.public_b64).encode()
        return None

    return txt
