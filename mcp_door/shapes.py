"""What the MCP door hands an agent: engine records as plain JSON, field by field.

Fields are named one by one, never copied wholesale, so nothing an agent should not hold
leaves the service: no DKIM private key, no webhook signing secret, no attachment bodies.
Names and shapes follow the API's (DESIGN.md section 3); timestamps are RFC 3339 UTC.
"""

from __future__ import annotations

from dataclasses import fields, is_dataclass
from datetime import UTC, datetime
from typing import Any

from engine.agents.previews import Confirmed, Preview
from engine.contacts.csv_import import ImportResult
from engine.delivery.verification import Verification
from engine.domains import registry
from engine.sending.email_log import EmailDetail
from engine.sending.intake import Validation
from storage.activity import ActivityEntry
from storage.contacts import Contact, ContactList
from storage.domains import Domain
from storage.emails import Email
from storage.suppressions import Suppression
from storage.templates import Template
from storage.webhooks import Delivery, Webhook

Json = dict[str, Any]


def _plain(value: Any) -> Any:
    if isinstance(value, datetime):
        return value.astimezone(UTC).isoformat().replace("+00:00", "Z")
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


def pick(record: Any, *names: str) -> Json:
    """The named fields of a record, as JSON values."""
    return {name: _plain(getattr(record, name)) for name in names}


def email_item(email: Email) -> Json:
    return {
        **pick(email, "id", "from_address"),
        "to_addresses": [t["email"] for t in email.to],
        **pick(email, "subject", "status", "tags", "source", "created_at", "delivered_at"),
    }


def email_detail(found: EmailDetail) -> Json:
    email = found.email
    return {
        **email_item(email),
        **pick(email, "from_name", "cc", "bcc", "reply_to", "text", "html", "headers"),
        "attachments": [
            {"filename": a["filename"], "content_type": a["content_type"]}
            for a in email.attachments
        ],
        **pick(email, "message_id", "rejection_reason", "retry_of_id", "send_at"),
        "recipients": [
            pick(r, "address", "kind", "status", "attempts", "next_attempt_at", "last_response")
            for r in found.recipients
        ],
        "timeline": [
            pick(e, "event_type", "recipient", "metadata", "created_at") for e in found.events
        ],
    }


def validation(checked: Validation) -> Json:
    return {
        "valid": checked.valid,
        "can_send": checked.can_send,
        "issues": [{"field": i.field, "error": i.error} for i in checked.issues],
    }


def preview(found: Preview) -> Json:
    out = {
        "action": found.action,
        "recipient_count": found.recipient_count,
        "first_recipient": found.first_recipient,
        "subject": found.subject,
        "issues": [{"field": i.field, "error": i.error} for i in found.issues],
        "max_recipients": found.max_recipients,
    }
    if found.confirmation is None:
        return {**out, "confirmation_token": None, "sent": False}
    return {
        **out,
        "confirmation_token": found.confirmation.token,
        "expires_at": _plain(found.confirmation.expires_at),
        "sent": False,
        "next": "nothing is sent yet: call `confirm` with confirmation_token to send",
    }


def confirmed(done: Confirmed) -> Json:
    if done.email is not None:
        result = pick(done.email, "id", "status", "message_id", "rejection_reason")
        sent = done.email.status != "rejected"
    else:
        assert done.broadcast is not None
        result = pick(done.broadcast, "broadcast_id", "queued", "skipped", "errors")
        sent = done.broadcast.queued > 0
    return {"action": done.action, "sent": sent, **result}


def suppression(entry: Suppression) -> Json:
    return pick(entry, "email", "reason", "created_at", "source_email_id")


def domain(found: Domain, smtp_host: str) -> Json:
    records = registry.dns_records(found, smtp_host)
    return {
        **pick(found, "id", "name", "status"),
        "dns_records": [_plain(r) for r in records],
        **pick(found, "open_tracking", "click_tracking", "created_at", "verified_at"),
    }


def webhook(hook: Webhook) -> Json:
    return pick(hook, "id", "url", "events", "is_active", "created_at")


def delivery(found: Delivery) -> Json:
    return pick(
        found,
        "id",
        "webhook_id",
        "event_type",
        "status",
        "response_status",
        "attempt",
        "next_retry_at",
        "created_at",
    )


def contact_list(found: ContactList) -> Json:
    return pick(found, "id", "name", "description", "contact_count", "created_at")


def contact(found: Contact) -> Json:
    return pick(found, "id", "email", "name", "metadata", "created_at")


def imported(result: ImportResult) -> Json:
    return pick(result, "imported", "skipped", "errors")


def activity_entry(entry: ActivityEntry) -> Json:
    return pick(
        entry,
        "id",
        "actor",
        "action",
        "target_type",
        "target_name",
        "target_id",
        "category",
        "meta",
        "created_at",
    )


def verification(checked: Verification) -> Json:
    return pick(checked, "email", "result", "reason", "mx_found", "mx_host")


def template(found: Template) -> Json:
    return pick(found, "id", "name", "subject", "html_body", "text_body", "variables", "updated_at")
