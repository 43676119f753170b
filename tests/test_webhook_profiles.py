"""Webhook payload profiles: each format's body against the receiving side's documented
examples (fixtures below, each with its source), and end to end to a real HTTPS receiver."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from typing import Any

import pytest

from engine.webhooks import profiles
from engine.webhooks.outbox import EVENT_TYPES, payload
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.webhooks import signature_valid

# listmonk's bounce webhook body (https://listmonk.app/docs/bounces/, "POST /webhooks/bounce").
LISTMONK_BOUNCE = {
    "email": "user1@mail.com",
    "campaign_uuid": "9f86b50d-5711-41c8-ab03-bc91c43d711b",
    "source": "api",
    "type": "hard",
    "meta": {},  # free-form: any JSON object (the docs show {"additional": "info"})
}
# SendGrid Event Webhook reference, "bounce" and "delivered" examples
# (https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/event).
SENDGRID_BOUNCE = {
    "email": "example@test.com",
    "timestamp": 1513299569,
    "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
    "event": "bounce",
    "category": ["cat facts"],
    "sg_event_id": "sg_event_id",
    "sg_message_id": "sg_message_id",
    "reason": "500 unknown recipient",
    "type": "bounce",
}
SENDGRID_DELIVERED = {
    "email": "example@test.com",
    "timestamp": 1513299569,
    "smtp-id": "<14c5d75ce93.dfd.64b469@ismtpd-555>",
    "event": "delivered",
    "category": ["cat facts"],
    "sg_event_id": "sg_event_id",
    "sg_message_id": "sg_message_id",
    "response": "250 OK",
}
# Amazon SES bounce notification (https://docs.aws.amazon.com/ses/latest/dg/
# notification-examples.html), inside the SNS envelope an HTTPS subscription receives.
SES_BOUNCE = {
    "notificationType": "Bounce",
    "bounce": {
        "bounceType": "Permanent",
        "bounceSubType": "General",
        "bouncedRecipients": [
            {
                "emailAddress": "jane@example.com",
                "status": "5.1.1",
                "action": "failed",
                "diagnosticCode": "smtp; 550 5.1.1 <jane@example.com>... User",
            }
        ],
        "timestamp": "2016-01-27T14:59:38.237Z",
        "feedbackId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa068a-000000",
    },
    "mail": {
        "timestamp": "2016-01-27T14:59:38.237Z",
        "source": "john@example.com",
        "messageId": "00000138111222aa-33322211-cccc-cccc-cccc-ddddaaaa0680-000000",
        "destination": ["jane@example.com"],
    },
}
SNS_ENVELOPE = {
    "Type": "Notification",
    "MessageId": "22b80b92-fdea-4c2c-8f9d-bdfb0c7bf324",
    "TopicArn": "arn:aws:sns:us-west-2:123456789012:MyTopic",
    "Message": "{...}",
    "Timestamp": "2012-05-02T00:54:06.655Z",
}
# Postmark bounce and delivery webhooks (https://postmarkapp.com/email-webhooks).
POSTMARK_BOUNCE = {
    "RecordType": "Bounce",
    "ID": 42,
    "Type": "HardBounce",
    "TypeCode": 1,
    "Name": "Hard bounce",
    "Tag": "Test",
    "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
    "Description": "The server was unable to deliver your message (ex: unknown user).",
    "Details": "Test bounce details",
    "Email": "john@example.com",
    "BouncedAt": "2014-08-01T13:28:10.2735393-04:00",
    "DumpAvailable": True,
    "Inactive": True,
    "CanActivate": True,
    "Subject": "Test subject",
    "Metadata": {},
}
POSTMARK_DELIVERY = {
    "RecordType": "Delivery",
    "MessageID": "883953f4-6105-42a2-a16a-77a8eac79483",
    "Recipient": "john@example.com",
    "DeliveredAt": "2014-08-01T13:28:10.2735393-04:00",
    "Details": "Test delivery webhook details",
    "Tag": "welcome-email",
    "Metadata": {},
}

EMAIL_ID = "5e1d8a3c-1b0e-4c4f-9d2e-2f7a9c0b1a11"
_AT = datetime(2026, 11, 23, 12, 0, 1, tzinfo=UTC)


def _ours(fmt: str, event: str, **meta: Any) -> Any:
    stored = payload(event, EMAIL_ID, "ann@customer.example", _AT, {"tags": ["welcome"], **meta})
    return json.loads(profiles.body(fmt, stored))


def _same_shape(ours: Any, documented: Any, where: str = "") -> None:
    """Every field of the documented example is in ours, of the same JSON type."""
    if isinstance(documented, dict):
        assert isinstance(ours, dict), where
        for key, value in documented.items():
            assert key in ours, f"{where}.{key} missing"
            _same_shape(ours[key], value, f"{where}.{key}")
    elif isinstance(documented, list):
        assert isinstance(ours, list), where
        for item in ours:
            _same_shape(item, documented[0], f"{where}[]")
    else:
        assert type(ours) is type(documented), f"{where}: {ours!r}"


def listmonk_accepts(body: Any) -> bool:
    """What listmonk's handler requires of a bounce (cmd/bounce.go `validateBounceFields`):
    an email (or subscriber UUID), a type of hard, soft or complaint, meta a JSON object."""
    return (
        isinstance(body, dict)
        and isinstance(body.get("email"), str)
        and re.fullmatch(r"[^@\s]+@[^@\s]+\.[^@\s]+", body["email"]) is not None
        and body.get("type") in ("hard", "soft", "complaint")
        and isinstance(body.get("source"), str)
        and isinstance(body.get("meta", {}), dict)
    )


def test_listmonk_bounce_matches_its_handler() -> None:
    for event, kind in (("email.bounced", "hard"), ("email.failed", "soft")):
        body = _ours("listmonk", event, response="550 5.1.1 no such user")
        _same_shape(body, {k: v for k, v in LISTMONK_BOUNCE.items() if k != "campaign_uuid"})
        assert listmonk_accepts(body) and body["type"] == kind
        assert body["email"] == "ann@customer.example"
        assert body["meta"]["email_id"] == EMAIL_ID
    assert _ours("listmonk", "email.complained")["type"] == "complaint"


def test_sendgrid_events_match_the_event_webhook_reference() -> None:
    [bounce] = _ours("sendgrid", "email.bounced", response="550 5.1.1 no such user")
    _same_shape(bounce, SENDGRID_BOUNCE)
    assert bounce["reason"] == "550 5.1.1 no such user"
    assert bounce["timestamp"] == int(_AT.timestamp()) and bounce["sg_message_id"] == EMAIL_ID
    [delivered] = _ours("sendgrid", "email.delivered", smtp_response="250 2.0.0 OK")
    _same_shape(delivered, SENDGRID_DELIVERED)
    assert delivered["response"] == "250 2.0.0 OK"
    [opened] = _ours("sendgrid", "email.opened", audience="human")
    assert opened["event"] == "open" and opened["sg_machine_open"] is False
    [prefetched] = _ours("sendgrid", "email.opened", audience="machine", reason="head_request")
    assert prefetched["sg_machine_open"] is True


def test_ses_notification_matches_the_sns_delivered_example() -> None:
    envelope = _ours("ses", "email.bounced", response="550 5.1.1 no such user")
    _same_shape(envelope, SNS_ENVELOPE)
    notification = json.loads(envelope["Message"])
    _same_shape(notification, SES_BOUNCE)
    assert notification["bounce"]["bouncedRecipients"][0]["emailAddress"] == "ann@customer.example"
    complaint = json.loads(_ours("ses", "email.complained")["Message"])
    assert complaint["notificationType"] == "Complaint"
    assert complaint["complaint"]["complainedRecipients"] == [
        {"emailAddress": "ann@customer.example"}
    ]
    delivery = json.loads(_ours("ses", "email.delivered")["Message"])
    assert delivery["notificationType"] == "Delivery"
    assert delivery["delivery"]["recipients"] == ["ann@customer.example"]


def test_postmark_records_match_the_webhook_examples() -> None:
    bounce = _ours("postmark", "email.bounced", response="550 5.1.1 no such user")
    _same_shape(bounce, POSTMARK_BOUNCE)
    assert bounce["Email"] == "ann@customer.example" and bounce["Tag"] == "welcome"
    _same_shape(_ours("postmark", "email.delivered"), POSTMARK_DELIVERY)
    assert _ours("postmark", "email.complained")["RecordType"] == "SpamComplaint"


def test_every_format_shapes_every_event_it_allows() -> None:
    for fmt in profiles.FORMATS:
        for event in profiles.events_of(fmt, EVENT_TYPES):
            assert _ours(fmt, event) is not None
    # An event the format has no name for goes as stored rather than not at all.
    assert _ours("listmonk", "email.opened")["event"] == "email.opened"


async def test_listmonk_webhook_receives_a_real_bounce_it_accepts(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    created = await account.client.post(
        "/v1/webhooks/",
        json={
            "url": https_receiver.url + "/webhooks/bounce",
            "events": ["email.bounced", "email.complained"],
            "format": "listmonk",
        },
    )
    assert created.status_code == 201, created.text
    hook = created.json()
    assert hook["format"] == "listmonk"
    route_mail(dns_server, "hooks.example")
    sent = await account.client.post("/v1/emails/", json=message("permfail@hooks.example"))
    await wait_for_status(account, sent.json()["id"])
    [request] = await https_receiver.wait_for_requests(1)
    assert request.path == "/webhooks/bounce"
    assert signature_valid(hook["secret"], request.body, request.headers["x-webhook-signature"])
    body = request.json()
    assert listmonk_accepts(body)
    assert body["email"] == "permfail@hooks.example" and body["type"] == "hard"
    assert body["meta"]["email_id"] == sent.json()["id"]


@pytest.mark.parametrize("fmt", ["sendgrid", "ses", "postmark"])
async def test_test_delivery_arrives_in_the_webhooks_format(
    service: Service, https_receiver: HttpsReceiver, fmt: str
) -> None:
    account = await service.account()
    created = await account.client.post(
        "/v1/webhooks/",
        json={"url": https_receiver.url, "events": ["email.delivered"], "format": fmt},
    )
    assert created.status_code == 201, created.text
    await account.client.post(f"/v1/webhooks/{created.json()['id']}/test")
    [request] = await https_receiver.wait_for_requests(1)
    body = request.json()
    if fmt == "sendgrid":
        _same_shape(body[0], SENDGRID_DELIVERED)
    elif fmt == "ses":
        assert json.loads(body["Message"])["notificationType"] == "Delivery"
    else:
        _same_shape(body, POSTMARK_DELIVERY)


async def test_format_and_its_events_are_validated(
    service: Service, https_receiver: HttpsReceiver
) -> None:
    account = await service.account()
    for body in (
        {"url": https_receiver.url, "events": ["email.bounced"], "format": "mailgun"},
        {"url": https_receiver.url, "events": ["email.opened"], "format": "listmonk"},
        {"url": https_receiver.url, "events": ["email.sent"], "format": "ses"},
    ):
        refused = await account.client.post("/v1/webhooks/", json=body)
        assert refused.status_code == 422, body
        assert refused.json()["code"] == "validation_error"
    created = await account.client.post(
        "/v1/webhooks/", json={"url": https_receiver.url, "events": ["email.opened"]}
    )
    hook = created.json()
    assert hook["format"] == "postroom"
    url = f"/v1/webhooks/{hook['id']}"
    refused = await account.client.patch(url, json={"format": "listmonk"})
    assert refused.status_code == 422
    changed = await account.client.patch(url, json={"format": "postmark"})
    assert changed.status_code == 200 and changed.json()["format"] == "postmark"
