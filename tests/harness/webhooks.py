"""Webhooks as tests set them up: an endpoint on the HTTPS receiver for some or all events,
and checking the signature a delivery carries."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any

from tests.harness.https_receiver import HttpsReceiver
from tests.harness.service import Account

EVENTS = [
    "email.sent",
    "email.delivered",
    "email.bounced",
    "email.opened",
    "email.clicked",
    "email.failed",
    "email.complained",
    "email.unsubscribed",
]


async def create_webhook(
    account: Account, receiver: HttpsReceiver, events: list[str] = EVENTS
) -> dict[str, Any]:
    created = await account.client.post(
        "/v1/webhooks/", json={"url": receiver.url + "/hook", "events": events}
    )
    assert created.status_code == 201, created.text
    hook: dict[str, Any] = created.json()
    return hook


def signature_valid(secret: str, body: bytes, signature: str) -> bool:
    expected = hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, signature)
