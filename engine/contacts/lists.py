"""Contact lists and contacts: the plan's limits, unique addresses per list, the activity log.

Every change is one unit of work that also writes its activity entry (`contact_list.*`,
Send category). Adding and removing contacts goes through the locked list, so its count and
the plan's contacts-per-list limit stay exact under concurrent writers.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from engine import plans
from engine.activity import Change, record
from engine.addresses import normalize_email
from engine.platform.errors import Conflict, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.templates.variables import header_safe
from storage import contacts
from storage.codec import new_id
from storage.contacts import Contact, ContactList
from storage.tx import Tx

METADATA_MAX_BYTES = 16 * 1024
MAX_ERRORS = 1_000


@dataclass(frozen=True, slots=True)
class ListPage:
    contact_list: ContactList
    contacts: list[Contact]


class CappedErrors:
    """Per-row problems of an import or a bulk send: the first MAX_ERRORS spelled out, the
    rest counted in one closing line (a response must not grow with a bad file's size)."""

    def __init__(self) -> None:
        self._items: list[str] = []
        self._more = 0

    def add(self, message: str) -> None:
        if len(self._items) < MAX_ERRORS:
            self._items.append(message)
        else:
            self._more += 1

    def result(self) -> list[str]:
        if self._more:
            return [*self._items, f"... and {self._more} more not listed"]
        return list(self._items)


@dataclass(frozen=True, slots=True)
class ListChanges:
    """The fields a PATCH supplied; absent ones stay as they are."""

    fields: dict[str, Any]  # name, description, icon_seed


def locked_list(tx: Tx, who: Principal, list_id: str) -> ContactList:
    """The workspace's list, locked for adding or removing contacts; NotFound otherwise."""
    found = contacts.lock_list(tx, who.workspace_id, list_id)
    if found is None:
        raise NotFound("contact list not found")
    return found


def _create(
    tx: Tx,
    who: Principal,
    name: str,
    description: str | None,
    icon_seed: str | None,
    now: datetime,
) -> ContactList:
    plan = plans.plan(who.plan)
    plans.check_workspace_room(
        tx, who.workspace_id, plan.contact_lists, contacts.count_lists, "contact lists", plan.name
    )
    created = ContactList(new_id(), who.workspace_id, name, description, icon_seed, 0, now, now)
    contacts.insert_list(tx, created)
    record(
        tx, who.workspace_id, who.user_email, Change("contact_list.created", name, created.id), now
    )
    return created


async def create_list(
    rt: Runtime, who: Principal, name: str, description: str | None, icon_seed: str | None
) -> ContactList:
    """A new, empty list; PlanLimit when the plan's number of lists is reached."""
    return await rt.db.write(_create, who, name, description, icon_seed, rt.clock.now())


async def list_lists(rt: Runtime, who: Principal) -> list[ContactList]:
    return await rt.db.read(contacts.list_all, who.workspace_id)


def _read(tx: Tx, who: Principal, list_id: str, offset: int, limit: int) -> ListPage:
    found = contacts.get_list(tx, who.workspace_id, list_id)
    if found is None:
        raise NotFound("contact list not found")
    return ListPage(found, contacts.page(tx, found.id, offset, limit))


async def read_list(rt: Runtime, who: Principal, list_id: str, page: int, limit: int) -> ListPage:
    """A list with one page (zero-based) of its contacts, in the order they were added."""
    return await rt.db.read(_read, who, list_id, page * limit, limit)


def _update(
    tx: Tx, who: Principal, list_id: str, changes: ListChanges, now: datetime
) -> ContactList:
    found = contacts.get_list(tx, who.workspace_id, list_id)
    if found is None:
        raise NotFound("contact list not found")
    updated = replace(found, **changes.fields, updated_at=now)
    contacts.update_list(tx, updated)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("contact_list.updated", updated.name, found.id, {"fields": sorted(changes.fields)}),
        now,
    )
    return updated


async def update_list(
    rt: Runtime, who: Principal, list_id: str, changes: ListChanges
) -> ContactList:
    """Change only the supplied fields of a list."""
    return await rt.db.write(_update, who, list_id, changes, rt.clock.now())


def _delete(tx: Tx, who: Principal, list_id: str, now: datetime) -> None:
    found = locked_list(tx, who, list_id)
    contacts.delete_list(tx, found.id)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("contact_list.deleted", found.name, found.id, {"contacts": found.contact_count}),
        now,
    )


async def delete_list(rt: Runtime, who: Principal, list_id: str) -> None:
    """Remove a list and all of its contacts for good."""
    await rt.db.write(_delete, who, list_id, rt.clock.now())


def check_metadata(metadata: dict[str, Any] | None) -> dict[str, Any] | None:
    """Metadata as stored (None when empty); Unprocessable when it is too large."""
    if not metadata:
        return None
    if len(json.dumps(metadata, separators=(",", ":"))) > METADATA_MAX_BYTES:
        raise Unprocessable(
            "metadata is over 16 KiB",
            errors=[{"loc": ["body", "metadata"], "msg": "over 16 KiB of JSON"}],
        )
    return metadata


def room_left(who: Principal, contact_list: ContactList) -> int | None:
    """How many more contacts the plan lets this list take; None when unlimited."""
    limit = plans.plan(who.plan).contacts_per_list
    if limit == plans.UNLIMITED:
        return None
    return max(0, limit - contact_list.contact_count)


def _add(tx: Tx, who: Principal, list_id: str, contact: Contact, now: datetime) -> Contact:
    found = locked_list(tx, who, list_id)
    if contacts.existing_emails(tx, found.id, [contact.email]):
        raise Conflict(f"{contact.email} is already in this list", code="contact_exists")
    plan = plans.plan(who.plan)
    plans.check_room(plan.contacts_per_list, found.contact_count, "contacts per list", plan.name)
    contacts.add(tx, found.id, [contact])
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("contact_list.contact_added", found.name, found.id, {"email": contact.email}),
        now,
    )
    return contact


async def add_contact(
    rt: Runtime,
    who: Principal,
    list_id: str,
    email: str,
    name: str | None,
    metadata: dict[str, Any] | None,
) -> Contact:
    """Add one contact: Conflict if its address is in the list, PlanLimit when it is full."""
    now = rt.clock.now()
    contact = Contact(
        new_id(), list_id, normalize_email(email), header_safe(name), check_metadata(metadata), now
    )
    return await rt.db.write(_add, who, list_id, contact, now)


def _remove(tx: Tx, who: Principal, list_id: str, contact_id: str, now: datetime) -> None:
    found = locked_list(tx, who, list_id)
    contact = contacts.get_contact(tx, found.id, contact_id)
    if contact is None:
        raise NotFound("contact not found")
    contacts.delete_contact(tx, found.id, contact.id)
    record(
        tx,
        who.workspace_id,
        who.user_email,
        Change("contact_list.contact_removed", found.name, found.id, {"email": contact.email}),
        now,
    )


async def remove_contact(rt: Runtime, who: Principal, list_id: str, contact_id: str) -> None:
    await rt.db.write(_remove, who, list_id, contact_id, rt.clock.now())
