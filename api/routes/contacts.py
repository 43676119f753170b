"""`/v1/contacts/`: contact lists, their contacts, CSV import and bulk send."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field, field_validator
from quart import Blueprint, Response, request
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import EmailText, In, Name, Out, Tag
from api.routes.emails import at_most_once
from api.validation import json_body, query_args
from engine.contacts import bulk_send, csv_import
from engine.contacts import lists as contacts
from engine.contacts.lists import ListChanges
from engine.platform.errors import InvalidRequest
from storage.contacts import Contact, ContactList

blueprint = Blueprint("contacts", __name__, url_prefix="/v1/contacts")

Description = Field(None, max_length=2000)
IconSeed = Field(None, max_length=200)


class CreateList(In):
    name: Name
    description: str | None = Description
    icon_seed: str | None = IconSeed


class UpdateList(In):
    name: Name | None = None
    description: str | None = Description
    icon_seed: str | None = IconSeed

    @field_validator("name")
    @classmethod
    def name_not_null(cls, value: str | None) -> str:
        if value is None:
            raise ValueError("name may not be null")
        return value


class ContactListOut(Out):
    id: str
    name: str
    description: str | None
    icon_seed: str | None
    contact_count: int
    created_at: datetime


class ContactOut(Out):
    id: str
    email: str
    name: str | None
    metadata: dict[str, Any] | None
    created_at: datetime


class ContactListDetailOut(ContactListOut):
    contacts: list[ContactOut]


class ListQuery(In):
    page: int = Field(0, ge=0, le=1_000_000)
    limit: int = Field(50, ge=1, le=200)


class AddContact(In):
    email: EmailText
    name: str | None = Field(None, max_length=200)
    metadata: dict[str, Any] | None = Field(None, max_length=100)


class ImportOut(BaseModel):
    imported: int
    skipped: int
    errors: list[str]


class BulkSendBody(In):
    contact_list_id: uuid.UUID
    sender_address_id: uuid.UUID
    subject: str = Field(min_length=1, max_length=998)
    html: str | None = None
    text: str | None = None
    tags: list[Tag] = Field(default_factory=list, max_length=20)


class BulkSendOut(BaseModel):
    queued: int
    skipped: int
    errors: list[str]


def _list(found: ContactList) -> dict[str, Any]:
    return ContactListOut.model_validate(found).model_dump(mode="json")


@blueprint.post("/")
@json_body(CreateList)
@document_response(ContactListOut, 201)
async def create(body: CreateList) -> tuple[dict[str, Any], int]:
    created = await contacts.create_list(
        runtime(), principal(), body.name, body.description, body.icon_seed
    )
    return _list(created), 201


@blueprint.get("/")
@document_response(list[ContactListOut])
async def list_lists() -> list[dict[str, Any]]:
    return [_list(found) for found in await contacts.list_lists(runtime(), principal())]


@blueprint.get("/<id:list_id>")
@query_args(ListQuery)
@document_response(ContactListDetailOut)
async def read(list_id: str, query: ListQuery) -> dict[str, Any]:
    found = await contacts.read_list(runtime(), principal(), list_id, query.page, query.limit)
    return ContactListDetailOut(
        **_list(found.contact_list),
        contacts=[ContactOut.model_validate(c) for c in found.contacts],
    ).model_dump(mode="json")


@blueprint.patch("/<id:list_id>")
@json_body(UpdateList)
@document_response(ContactListOut)
async def update(list_id: str, body: UpdateList) -> dict[str, Any]:
    changes = ListChanges({name: getattr(body, name) for name in body.model_fields_set})
    return _list(await contacts.update_list(runtime(), principal(), list_id, changes))


@blueprint.delete("/<id:list_id>")
async def delete(list_id: str) -> Response:
    await contacts.delete_list(runtime(), principal(), list_id)
    return Response(b"", status=204)


def _contact(contact: Contact) -> dict[str, Any]:
    return ContactOut.model_validate(contact).model_dump(mode="json")


@blueprint.post("/<id:list_id>/contacts")
@json_body(AddContact)
@document_response(ContactOut, 201)
async def add_contact(list_id: str, body: AddContact) -> tuple[dict[str, Any], int]:
    added = await contacts.add_contact(
        runtime(), principal(), list_id, body.email, body.name, body.metadata
    )
    return _contact(added), 201


@blueprint.delete("/<id:list_id>/contacts/<id:contact_id>")
async def remove_contact(list_id: str, contact_id: str) -> Response:
    await contacts.remove_contact(runtime(), principal(), list_id, contact_id)
    return Response(b"", status=204)


@blueprint.post("/<id:list_id>/upload")
@document_response(ImportOut)
async def upload(list_id: str) -> dict[str, Any]:
    files = await request.files
    upload = files.get("file")
    if upload is None:
        raise InvalidRequest("send the CSV as multipart/form-data field `file`", code="no_file")
    result = await csv_import.import_csv(runtime(), principal(), list_id, upload.stream)
    return ImportOut(
        imported=result.imported, skipped=result.skipped, errors=result.errors
    ).model_dump()


@blueprint.post("/<id:list_id>/send")
@json_body(BulkSendBody)
@document_response(BulkSendOut)
async def send(list_id: str, body: BulkSendBody) -> tuple[dict[str, Any], int]:
    req = bulk_send.BulkSendRequest(
        contact_list_id=str(body.contact_list_id),
        sender_address_id=str(body.sender_address_id),
        subject=body.subject,
        html=body.html,
        text=body.text,
        tags=tuple(body.tags),
    )

    async def run() -> tuple[Any, int]:
        result = await bulk_send.send_to_list(runtime(), principal(), list_id, req)
        out = BulkSendOut(queued=result.queued, skipped=result.skipped, errors=result.errors)
        return out.model_dump(), 200

    response, status = await at_most_once(body, run)
    return response, status
