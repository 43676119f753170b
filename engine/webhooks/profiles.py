"""Webhook payload profiles: a webhook's `format` names the body its receiver expects.

Pure functions from our stored delivery payload (engine/webhooks/outbox.py `payload`: event,
email_id, recipient, timestamp, metadata) to the bytes POSTed; `postroom` sends it as it is.
Each other format is the shape the receiving side's public documentation shows, carrying
only the events that format has a name for: a webhook in that format may subscribe to those
alone (`events_of`), so nothing is ever sent in a shape its receiver would refuse.
Signing stays ours (X-Webhook-Signature over the bytes sent); receivers that want a secret
in the URL or basic auth take it in the webhook's URL.
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import Any

FORMATS = ("postroom", "listmonk", "sendgrid", "ses", "postmark")
DEFAULT = "postroom"

# listmonk's bounce webhook (`POST /webhooks/bounce`, knadh/listmonk cmd/bounce.go
# `validateBounceFields`, docs https://listmonk.app/docs/bounces/): email (or
# subscriber_uuid), source, type hard|soft|complaint, meta (a JSON object).
_LISTMONK_TYPE = {"email.bounced": "hard", "email.failed": "soft", "email.complained": "complaint"}

# SendGrid Event Webhook (https://www.twilio.com/docs/sendgrid/for-developers/tracking-events/
# event): a JSON array of events with email, timestamp (Unix seconds), event, sg_event_id,
# sg_message_id, smtp-id, category, and per event reason/response/url/type.
_SENDGRID_EVENT = {
    "email.sent": "processed",
    "email.delivered": "delivered",
    "email.opened": "open",
    "email.clicked": "click",
    "email.bounced": "bounce",
    "email.failed": "dropped",
    "email.complained": "spamreport",
    "email.unsubscribed": "unsubscribe",
}

# Amazon SES notifications as SNS delivers them (https://docs.aws.amazon.com/ses/latest/dg/
# notification-contents.html, notification-examples.html): an SNS envelope whose Message is
# the JSON text of {notificationType: Bounce|Complaint|Delivery, mail, bounce|complaint|delivery}.
_SES_TYPE = {
    "email.bounced": "Bounce",
    "email.failed": "Bounce",
    "email.complained": "Complaint",
    "email.delivered": "Delivery",
}

# Postmark webhooks (https://postmarkapp.com/email-webhooks, and the postmark npm package's
# models/bounces/Bounce.d.ts): one object per event, told apart by RecordType.
_POSTMARK_RECORD = {
    "email.bounced": "Bounce",
    "email.failed": "Bounce",
    "email.complained": "SpamComplaint",
    "email.delivered": "Delivery",
    "email.opened": "Open",
    "email.clicked": "Click",
    "email.unsubscribed": "SubscriptionChange",
}

_EVENTS = {
    "listmonk": tuple(_LISTMONK_TYPE),
    "sendgrid": tuple(_SENDGRID_EVENT),
    "ses": tuple(_SES_TYPE),
    "postmark": tuple(_POSTMARK_RECORD),
}


def events_of(fmt: str, all_events: tuple[str, ...]) -> tuple[str, ...]:
    """The event types a webhook in `fmt` may subscribe to."""
    return _EVENTS.get(fmt, all_events)


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _unix(stamp: str) -> int:
    return int(datetime.fromisoformat(stamp).timestamp())


def _reason(meta: dict[str, Any]) -> str:
    return str(meta.get("smtp_response") or meta.get("response") or meta.get("reason") or "")


def _listmonk(event: dict[str, Any], meta: dict[str, Any]) -> Any:
    return {
        "email": event["recipient"],
        "source": "postroom",
        "type": _LISTMONK_TYPE[event["event"]],
        "meta": {"email_id": event["email_id"], **meta},
        "created_at": event["timestamp"],
    }


def _sendgrid(event: dict[str, Any], meta: dict[str, Any]) -> Any:
    name = _SENDGRID_EVENT[event["event"]]
    item: dict[str, Any] = {
        "email": event["recipient"],
        "timestamp": _unix(event["timestamp"]),
        "event": name,
        "sg_event_id": f"{event['email_id']}-{name}-{_unix(event['timestamp'])}",
        "sg_message_id": event["email_id"],
        "smtp-id": meta.get("message_id") or f"<{event['email_id']}>",
        "category": meta.get("tags", []),
    }
    if name == "delivered":
        item["response"] = _reason(meta)
    elif name in ("bounce", "dropped"):
        item["reason"] = _reason(meta)
        if name == "bounce":
            item["type"] = "bounce"
    elif name == "click":
        item["url"] = meta.get("url", "")
    elif name == "open":
        # SendGrid's flag for opens by privacy proxies (engine/sending/tracking.py's verdict).
        item["sg_machine_open"] = meta.get("audience") == "machine"
    return [item]


def _ses(event: dict[str, Any], meta: dict[str, Any]) -> Any:
    kind = _SES_TYPE[event["event"]]
    at = event["timestamp"]
    recipient = event["recipient"]
    message: dict[str, Any] = {
        "notificationType": kind,
        "mail": {
            "timestamp": at,
            "messageId": event["email_id"],
            "source": meta.get("from", ""),
            "destination": [recipient],
        },
    }
    if kind == "Bounce":
        permanent = event["event"] == "email.bounced"
        message["bounce"] = {
            "bounceType": "Permanent" if permanent else "Transient",
            "bounceSubType": "General",
            "bouncedRecipients": [
                {
                    "emailAddress": recipient,
                    "action": "failed",
                    "status": "5.0.0" if permanent else "4.0.0",
                    "diagnosticCode": _reason(meta),
                }
            ],
            "timestamp": at,
            "feedbackId": event["email_id"],
        }
    elif kind == "Complaint":
        message["complaint"] = {
            "complainedRecipients": [{"emailAddress": recipient}],
            "timestamp": at,
            "feedbackId": event["email_id"],
            "complaintFeedbackType": "abuse",
        }
    else:
        message["delivery"] = {
            "timestamp": at,
            "recipients": [recipient],
            "smtpResponse": _reason(meta),
            "processingTimeMillis": 0,
        }
    return {
        "Type": "Notification",
        "MessageId": f"{event['email_id']}-{kind}",
        "TopicArn": "arn:postroom:webhooks",
        "Message": json.dumps(message, separators=(",", ":")),
        "Timestamp": at,
    }


def _postmark(event: dict[str, Any], meta: dict[str, Any]) -> Any:
    record = _POSTMARK_RECORD[event["event"]]
    at = event["timestamp"]
    recipient = event["recipient"]
    common = {
        "RecordType": record,
        "MessageID": event["email_id"],
        "MessageStream": "outbound",
        "Tag": meta.get("tag") or "",
        "Metadata": {},
    }
    if record in ("Bounce", "SpamComplaint"):
        hard = event["event"] == "email.bounced"
        kind, code, name = {
            "email.bounced": ("HardBounce", 1, "Hard bounce"),
            "email.failed": ("SoftBounce", 4096, "Soft bounce"),
            "email.complained": ("SpamComplaint", 512, "Spam complaint"),
        }[event["event"]]
        return {
            **common,
            # Postmark's is a number: the id's last 48 bits (random; the first are its time).
            "ID": int(event["email_id"].replace("-", "")[-12:], 16),
            "ServerID": 0,
            "Type": kind,
            "TypeCode": code,
            "Name": name,
            "Description": _reason(meta),
            "Details": _reason(meta),
            "Email": recipient,
            "From": meta.get("from", ""),
            "BouncedAt": at,
            "Subject": meta.get("subject", ""),
            "DumpAvailable": False,
            "Inactive": hard or record == "SpamComplaint",
            "CanActivate": True,
        }
    if record == "Delivery":
        return {**common, "Recipient": recipient, "DeliveredAt": at, "Details": _reason(meta)}
    if record == "Open":
        return {**common, "Recipient": recipient, "ReceivedAt": at, "FirstOpen": True}
    if record == "Click":
        url = meta.get("url", "")
        return {**common, "Recipient": recipient, "ReceivedAt": at, "OriginalLink": url}
    return {
        **common,
        "Recipient": recipient,
        "ChangedAt": at,
        "SuppressSending": True,
        "SuppressionReason": "ManualSuppression",
    }


_SHAPERS = {"listmonk": _listmonk, "sendgrid": _sendgrid, "ses": _ses, "postmark": _postmark}


def body(fmt: str, payload: str) -> bytes:
    """The bytes to POST for a delivery of `payload` to a webhook in `fmt`.

    An event the format has no name for (subscribed before the format changed) or a
    payload not of our shape (a delivery queued by an older version) goes as it is.
    """
    shaper = _SHAPERS.get(fmt)
    if shaper is None:
        return payload.encode()
    try:
        event = json.loads(payload)
        meta = event.get("metadata") or {}
        return _dumps(shaper(event, meta))
    except (ValueError, KeyError, TypeError, AttributeError):
        return payload.encode()
