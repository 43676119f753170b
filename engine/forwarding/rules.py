"""Forwarding rules: mail to an address on a verified domain goes on to emails and URLs.

Creating a rule needs a plan with forwards, a verified domain of the workspace (another
workspace's domain is 403, as the spec has it), a source address on that domain, the
domain's MX pointing at this service (`{smtp_host}`, checked in DNS; not for a sandboxed
workspace, whose messages come in through the sandbox: engine/sandbox/inbound.py), and at
least one destination. Destination URLs pass the webhook URL check (HTTPS, no private targets).
The inbound server reads rules from the database, so every change takes effect at once.
Address syntax and missing fields are 400 here, as the spec's Errors table has it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from engine import plans
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform import dns, outbound_http
from engine.platform.errors import (
    Conflict,
    Forbidden,
    InvalidRequest,
    NotFound,
    Unprocessable,
)
from engine.platform.runtime import Principal, Runtime
from storage import domains, forwards, sandbox
from storage.codec import new_id
from storage.domains import Domain
from storage.forwards import Forward, LogEntry
from storage.tx import Tx

MAX_DESTINATIONS = 50  # per list
STATS_WINDOW = timedelta(days=30)
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Stats:
    total_this_month: int
    per_rule: dict[str, int]


def _unprocessable(field: str, message: str, code: str = "validation_error") -> Unprocessable:
    return Unprocessable(message, code=code, errors=[{"loc": ["body", field], "msg": message}])


def _address(value: str, field: str) -> str:
    try:
        return normalize_email(value, field)
    except Unprocessable as exc:
        raise InvalidRequest(exc.detail, code="invalid_email", errors=exc.extra["errors"]) from None


def _emails(values: list[str]) -> list[str]:
    if len(values) > MAX_DESTINATIONS:
        raise InvalidRequest(f"at most {MAX_DESTINATIONS} destination_emails")
    return list(dict.fromkeys(_address(v, "destination_emails") for v in values))


async def _urls(rt: Runtime, values: list[str]) -> list[str]:
    if len(values) > MAX_DESTINATIONS:
        raise InvalidRequest(f"at most {MAX_DESTINATIONS} destination_urls")
    checked = []
    for url in dict.fromkeys(values):
        checked.append(await outbound_http.checked_url(rt, url, "destination_urls"))
    return checked


def _need_destinations(emails: list[str], urls: list[str]) -> None:
    if not emails and not urls:
        raise InvalidRequest(
            "at least one of destination_emails or destination_urls is required",
            code="no_destinations",
        )


def _check_not_source(source: str, emails: list[str]) -> None:
    if source in emails:
        raise _unprocessable("destination_emails", "a forward cannot send mail to its own source")


def _domain(tx: Tx, who: Principal, domain_id: str) -> Domain:
    if _UUID.fullmatch(domain_id):
        found = domains.get(tx, who.workspace_id, domain_id.lower())
        if found is not None:
            return found
        if domains.by_id(tx, domain_id.lower()) is not None:
            raise Forbidden("the domain belongs to another account", code="domain_not_owned")
    raise NotFound("domain not found")


async def _check_mx(rt: Runtime, domain: Domain) -> None:
    host = rt.smtp_host.rstrip(".").lower()
    try:
        records = await dns.mx(rt.resolver, domain.name)
    except dns.TemporaryDnsError:
        raise _unprocessable(
            "domain_id",
            f"the MX records of {domain.name} could not be looked up; try again",
            code="mx_not_configured",
        ) from None
    if host not in {exchange for _, exchange in records}:
        raise _unprocessable(
            "domain_id",
            f"{domain.name} needs an MX record pointing at {host} to receive mail",
            code="mx_not_configured",
        )


def _insert(tx: Tx, who: Principal, forward: Forward) -> Forward:
    plans.check_workspace_room(
        tx, who.workspace_id, plans.plan(who.plan).forwards, forwards.count, "forwards", who.plan
    )
    if forwards.by_source(tx, forward.source_email) is not None:
        raise Conflict(
            f"a forward for {forward.source_email} already exists", code="forward_exists"
        )
    forwards.insert(tx, forward)
    change = Change("forward.created", forward.source_email, forward.id)
    record(tx, who.workspace_id, who.user_email, change, forward.created_at)
    return forward


async def create(
    rt: Runtime,
    who: Principal,
    source_email: str | None,
    domain_id: str | None,
    destination_emails: list[str] | None,
    destination_urls: list[str] | None,
) -> Forward:
    """Create an active rule (the checks are in the module docstring)."""
    if source_email is None or domain_id is None:
        missing = "source_email" if source_email is None else "domain_id"
        raise InvalidRequest(f"{missing} is required", code="missing_field")
    source = _address(source_email, "source_email")
    emails = _emails(destination_emails or [])
    plans.require(plans.plan(who.plan).forwards != 0, "Forwarding", who.plan)
    domain = await rt.db.read(_domain, who, domain_id)
    if domain.status != "verified":
        raise _unprocessable(
            "domain_id", f"{domain.name} is not verified", code="domain_not_verified"
        )
    if source.rpartition("@")[2] != domain.name:
        raise _unprocessable("source_email", f"source_email must be an address on {domain.name}")
    _check_not_source(source, emails)
    urls = await _urls(rt, destination_urls or [])
    _need_destinations(emails, urls)
    if not await rt.db.read(sandbox.is_sandboxed, who.workspace_id):
        await _check_mx(rt, domain)
    forward = Forward(
        id=new_id(),
        workspace_id=who.workspace_id,
        domain_id=domain.id,
        source_email=source,
        destination_emails=emails,
        destination_urls=urls,
        is_active=True,
        delivery_count=0,
        last_delivered_at=None,
        created_at=rt.clock.now(),
    )
    return await rt.db.write(_insert, who, forward)


async def list_all(rt: Runtime, who: Principal) -> list[Forward]:
    return await rt.db.read(forwards.list_all, who.workspace_id)


def _update(
    tx: Tx,
    who: Principal,
    forward_id: str,
    emails: list[str] | None,
    urls: list[str] | None,
    is_active: bool | None,
    now: datetime,
) -> Forward:
    forward = forwards.get(tx, who.workspace_id, forward_id)
    if forward is None:
        raise NotFound("forward not found")
    changed = replace(
        forward,
        destination_emails=forward.destination_emails if emails is None else emails,
        destination_urls=forward.destination_urls if urls is None else urls,
        is_active=forward.is_active if is_active is None else is_active,
    )
    _need_destinations(changed.destination_emails, changed.destination_urls)
    _check_not_source(changed.source_email, changed.destination_emails)
    forwards.update(tx, changed, now)
    meta = {"is_active": changed.is_active} if is_active is not None else None
    change = Change("forward.updated", changed.source_email, changed.id, meta)
    record(tx, who.workspace_id, who.user_email, change, now)
    return changed


async def update(
    rt: Runtime,
    who: Principal,
    forward_id: str,
    destination_emails: list[str] | None,
    destination_urls: list[str] | None,
    is_active: bool | None,
) -> Forward:
    """Change destinations or pause/resume (None leaves a field as it is)."""
    emails = None if destination_emails is None else _emails(destination_emails)
    urls = None if destination_urls is None else await _urls(rt, destination_urls)
    return await rt.db.write(_update, who, forward_id, emails, urls, is_active, rt.clock.now())


def _delete(tx: Tx, who: Principal, forward_id: str, now: datetime) -> None:
    forward = forwards.get(tx, who.workspace_id, forward_id)
    if forward is None:
        raise NotFound("forward not found")
    forwards.delete(tx, forward.id)
    change = Change("forward.deleted", forward.source_email, forward.id)
    record(tx, who.workspace_id, who.user_email, change, now)


async def delete(rt: Runtime, who: Principal, forward_id: str) -> None:
    await rt.db.write(_delete, who, forward_id, rt.clock.now())


async def logs(
    rt: Runtime, who: Principal, forward_id: str | None, page_number: int, limit: int
) -> list[LogEntry]:
    return await rt.db.read(
        forwards.logs_page, who.workspace_id, forward_id, page_number * limit, limit
    )


async def logs_count(rt: Runtime, who: Principal, forward_id: str | None) -> int:
    return await rt.db.read(forwards.logs_count, who.workspace_id, forward_id)


async def stats(rt: Runtime, who: Principal) -> Stats:
    """Forwarded copies in the last 30 days, in total and per rule."""
    since = rt.clock.now() - STATS_WINDOW
    counts = await rt.db.read(forwards.counts_since, who.workspace_id, since)
    rules = await rt.db.read(forwards.list_all, who.workspace_id)
    per_rule = {rule.id: 0 for rule in rules} | counts
    return Stats(total_this_month=sum(counts.values()), per_rule=per_rule)
