"""Sender addresses: the addresses on a workspace's domains that mail may come from."""

from __future__ import annotations

from datetime import datetime

from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.mail.compose import header_text_problem
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from storage import domains
from storage.codec import new_id
from storage.domains import Sender
from storage.tx import Tx


def _insert(tx: Tx, who: Principal, email: str, name: str | None, now: datetime) -> Sender:
    domain_name = email.rsplit("@", 1)[1]
    domain = domains.by_name(tx, who.workspace_id, domain_name)
    if domain is None:
        raise Unprocessable(
            f"{domain_name} is not a domain of this workspace; add it first",
            code="unknown_domain",
            errors=[{"loc": ["body", "email"], "msg": "address is not on a workspace domain"}],
        )
    if domains.sender_by_email(tx, who.workspace_id, email) is not None:
        raise Conflict(f"{email} is already a sender", code="sender_exists")
    sender = Sender(new_id(), who.workspace_id, domain.id, email, name, True, now)
    domains.insert_sender(tx, sender)
    record(tx, who.workspace_id, who.user_email, Change("sender.created", email, sender.id), now)
    return sender


async def create(rt: Runtime, who: Principal, email: str, name: str | None) -> Sender:
    """Register a sender address on one of the workspace's domains."""
    if name is not None and (problem := header_text_problem(name)):
        message = f"name {problem}"
        raise Unprocessable(message, errors=[{"loc": ["body", "name"], "msg": message}])
    return await rt.db.write(_insert, who, normalize_email(email), name, rt.clock.now())


async def list_all(rt: Runtime, who: Principal) -> list[Sender]:
    return await rt.db.read(domains.list_senders, who.workspace_id)


def _delete(tx: Tx, who: Principal, sender_id: str, now: datetime) -> None:
    sender = domains.get_sender(tx, who.workspace_id, sender_id)
    if sender is None:
        raise NotFound("sender not found")
    domains.delete_sender(tx, sender.id)
    record(
        tx, who.workspace_id, who.user_email, Change("sender.deleted", sender.email, sender.id), now
    )


async def delete(rt: Runtime, who: Principal, sender_id: str) -> None:
    await rt.db.write(_delete, who, sender_id, rt.clock.now())
