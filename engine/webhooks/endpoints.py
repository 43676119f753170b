"""Webhooks: endpoints that receive signed email events, and the log of their deliveries.

A webhook's URL must be HTTPS; unless POSTROOM_ALLOW_PRIVATE_TARGETS is on, it must not name
or resolve to a loopback, private, link-local or reserved address (no SSRF into the
operator's network). The signing secret (`whsec_…`) is generated here and shown in responses,
as the spec's Webhook resource has it; it is sealed at rest. Basic-auth credentials for
receivers that expect them are stored sealed and never shown again (responses carry the
username only), and belong to the URL's origin: a URL moved to another scheme, host or port
loses them unless the same change gives them again.
"""

from __future__ import annotations

import secrets
from dataclasses import replace
from datetime import datetime
from typing import Literal

from engine.activity import Change, record
from engine.platform import outbound_http
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.webhooks import outbox, profiles
from storage import webhooks
from storage.codec import new_id
from storage.tx import Tx
from storage.webhooks import BasicAuth, Delivery, ReplayFilter, Webhook

SAMPLE_EVENT = "email.delivered"
REPLAYABLE = ("dead", "delivered")  # a pending or retrying delivery is still on its way
KEEP: Literal["keep"] = "keep"  # an update that leaves the basic-auth credentials as they are


def _invalid(field: str, message: str) -> Unprocessable:
    return Unprocessable(message, errors=[{"loc": ["body", field], "msg": message}])


def _checked_events(events: list[str], fmt: str = profiles.DEFAULT) -> list[str]:
    allowed = profiles.events_of(fmt, outbox.EVENT_TYPES)
    unknown = sorted(set(events) - set(allowed))
    if unknown or not events:
        within = "" if fmt == profiles.DEFAULT else f" (the {fmt} format carries only these)"
        raise _invalid(
            "events", f"events must be a non-empty list of: {', '.join(allowed)}{within}"
        )
    return list(dict.fromkeys(events))


def _checked_format(fmt: str) -> str:
    if fmt not in profiles.FORMATS:
        raise _invalid("format", f"format must be one of: {', '.join(profiles.FORMATS)}")
    return fmt


def _insert(tx: Tx, who: Principal, hook: Webhook) -> Webhook:
    webhooks.insert(tx, hook)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("webhook.created", hook.url, hook.id),
        hook.created_at,
    )
    return hook


async def create(
    rt: Runtime,
    who: Principal,
    url: str,
    events: list[str],
    fmt: str = profiles.DEFAULT,
    basic_auth: BasicAuth | None = None,
) -> Webhook:
    fmt = _checked_format(fmt)
    hook = Webhook(
        id=new_id(),
        workspace_id=who.workspace_id,
        url=await outbound_http.checked_url(rt, url),
        events=_checked_events(events, fmt),
        secret="whsec_" + secrets.token_urlsafe(32),
        is_active=True,
        created_at=rt.clock.now(),
        format=fmt,
        basic_auth=basic_auth,
    )
    return await rt.db.write(_insert, who, hook)


async def list_active(rt: Runtime, who: Principal) -> list[Webhook]:
    return await rt.db.read(webhooks.list_active, who.workspace_id)


async def get(rt: Runtime, who: Principal, webhook_id: str) -> Webhook:
    hook = await rt.db.read(webhooks.get, who.workspace_id, webhook_id)
    if hook is None:
        raise NotFound("webhook not found")
    return hook


def _update(
    tx: Tx,
    who: Principal,
    webhook_id: str,
    url: str | None,
    events: list[str] | None,
    is_active: bool | None,
    fmt: str | None,
    basic_auth: BasicAuth | Literal["keep"] | None,
    now: datetime,
) -> Webhook:
    hook = webhooks.get(tx, who.workspace_id, webhook_id)
    if hook is None:
        raise NotFound("webhook not found")
    new_url = hook.url if url is None else url
    # Credentials were given for one origin: a URL with another drops them unless this
    # request gives them again, so they are never sent where their owner did not send them.
    moved = outbound_http.origin(new_url) != outbound_http.origin(hook.url)
    if basic_auth == "keep":
        basic_auth = None if moved else hook.basic_auth
    changed = replace(
        hook,
        url=new_url,
        events=hook.events if events is None else events,
        is_active=hook.is_active if is_active is None else is_active,
        format=hook.format if fmt is None else fmt,
        basic_auth=basic_auth,
    )
    # The events must suit the format, whichever of the two changed.
    _checked_events(changed.events, changed.format)
    webhooks.update(tx, changed, now)
    verb = (
        "updated"
        if is_active is None or is_active == hook.is_active
        else ("resumed" if is_active else "paused")
    )
    meta = (
        {"basic_auth": "removed: the URL moved to another origin"}
        if (moved and hook.basic_auth is not None and changed.basic_auth is None)
        else None
    )
    change = Change(f"webhook.{verb}", changed.url, hook.id, meta)
    record(tx, who.workspace_id, who.user_email, change, now)
    return changed


async def update(
    rt: Runtime,
    who: Principal,
    webhook_id: str,
    url: str | None,
    events: list[str] | None,
    is_active: bool | None,
    fmt: str | None = None,
    basic_auth: BasicAuth | Literal["keep"] | None = KEEP,
) -> Webhook:
    """Change the URL, events, active flag or format (None leaves a field as it is) and the
    basic-auth credentials (None removes them, `KEEP` leaves them, unless the URL moves to
    another origin: then they are removed too)."""
    checked_fmt = None if fmt is None else _checked_format(fmt)
    checked_url = None if url is None else await outbound_http.checked_url(rt, url)
    checked_events = (
        None if events is None else _checked_events(events, checked_fmt or profiles.DEFAULT)
    )
    return await rt.db.write(
        _update,
        who,
        webhook_id,
        checked_url,
        checked_events,
        is_active,
        checked_fmt,
        basic_auth,
        rt.clock.now(),
    )


def _delete(tx: Tx, who: Principal, webhook_id: str, now: datetime) -> None:
    hook = webhooks.get(tx, who.workspace_id, webhook_id)
    if hook is None:
        raise NotFound("webhook not found")
    webhooks.delete(tx, hook.id, now)
    record(tx, who.workspace_id, who.user_email, Change("webhook.deleted", hook.url, hook.id), now)


async def delete(rt: Runtime, who: Principal, webhook_id: str) -> None:
    await rt.db.write(_delete, who, webhook_id, rt.clock.now())


def _queue_test(tx: Tx, who: Principal, webhook_id: str, now: datetime) -> Webhook:
    hook = webhooks.get(tx, who.workspace_id, webhook_id)
    if hook is None:
        raise NotFound("webhook not found")
    # A webhook not subscribed to the sample event (a bounce-only format) gets one it takes.
    event = SAMPLE_EVENT if SAMPLE_EVENT in hook.events else hook.events[0]
    sample = outbox.payload(
        event,
        "00000000-0000-0000-0000-000000000000",
        "test@example.com",
        now,
        {
            "subject": "Test event from Postroom",
            "tags": ["test"],
            "domain": "example.com",
            "smtp_response": "250 2.0.0 OK (test)",
        },
    )
    webhooks.queue_one(tx, hook, event, sample, now)
    return hook


async def send_test(rt: Runtime, who: Principal, webhook_id: str) -> Webhook:
    """Queue a sample `email.delivered` delivery (or of the webhook's first event, if it does
    not take that one), logged like any other."""
    return await rt.db.write(_queue_test, who, webhook_id, rt.clock.now())


async def deliveries(
    rt: Runtime, who: Principal, webhook_id: str, status: str | None, page_number: int, limit: int
) -> tuple[list[Delivery], int]:
    await get(rt, who, webhook_id)
    return await rt.db.read(
        webhooks.deliveries_page, who.workspace_id, webhook_id, status, page_number * limit, limit
    )


async def delivery(
    rt: Runtime, who: Principal, delivery_id: str, webhook_id: str | None = None
) -> Delivery:
    found = await rt.db.read(webhooks.get_delivery, who.workspace_id, delivery_id)
    if found is None or (webhook_id is not None and found.webhook_id != webhook_id):
        raise NotFound("delivery not found")
    return found


def _replay(tx: Tx, who: Principal, delivery_id: str, now: datetime) -> None:
    found = webhooks.get_delivery(tx, who.workspace_id, delivery_id)
    if found is None:
        raise NotFound("delivery not found")
    if found.status not in REPLAYABLE:
        raise Conflict(
            f"only dead or delivered deliveries can be replayed; this one is {found.status}",
            code="not_replayable",
        )
    webhooks.replay(tx, delivery_id, now)


async def replay(rt: Runtime, who: Principal, delivery_id: str) -> Delivery:
    """Queue a dead or delivered delivery again, as a fresh first attempt."""
    await rt.db.write(_replay, who, delivery_id, rt.clock.now())
    return await delivery(rt, who, delivery_id)


def _replay_matching(
    tx: Tx, who: Principal, match: ReplayFilter, dry_run: bool, now: datetime
) -> int:
    hook = webhooks.get(tx, who.workspace_id, match.webhook_id)
    if hook is None:
        raise NotFound("webhook not found")
    count = webhooks.replay_matching(tx, who.workspace_id, match, now, dry_run)
    if not dry_run:
        meta = {
            "replayed": count,
            "status": match.status,
            "since": None if match.since is None else match.since.isoformat(),
            "until": None if match.until is None else match.until.isoformat(),
            "event_types": list(match.event_types),
        }
        change = Change("webhook.replayed", hook.url, hook.id, meta)
        record(tx, who.workspace_id, who.user_email, change, now)
    return count


async def replay_matching(rt: Runtime, who: Principal, match: ReplayFilter, dry_run: bool) -> int:
    """Queue again every delivery of a webhook that `match` takes (dry run: count them);
    how many. Logged in the activity log unless a dry run."""
    if match.status not in REPLAYABLE:
        raise _invalid("status", f"status must be one of: {', '.join(REPLAYABLE)}")
    if match.since is not None and match.until is not None and match.since >= match.until:
        raise _invalid("until", "until must be later than since")
    if match.event_types:
        _checked_events(list(match.event_types))
    count: int = await rt.db.write(_replay_matching, who, match, dry_run, rt.clock.now())
    return count
