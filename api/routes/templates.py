"""`/v1/templates/`: reusable templates (Starter plan and above)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import Field, field_validator
from quart import Blueprint, Response
from quart_schema import document_response

from api.auth import principal, runtime
from api.models import In, Name, Out
from api.validation import json_body
from engine.templates import library as templates
from storage.templates import Template

blueprint = Blueprint("templates", __name__, url_prefix="/v1/templates")

BODY_MAX = 1_000_000  # characters per body; the request size limit applies as well


class CreateTemplate(In):
    name: Name
    subject: str = Field("", max_length=998)
    html_body: str = Field("", max_length=BODY_MAX)
    text_body: str = Field("", max_length=BODY_MAX)
    blocks_json: dict[str, Any] | None = None


class UpdateTemplate(In):
    name: Name | None = None
    subject: str | None = Field(None, max_length=998)
    html_body: str | None = Field(None, max_length=BODY_MAX)
    text_body: str | None = Field(None, max_length=BODY_MAX)
    blocks_json: dict[str, Any] | None = None

    @field_validator("name", "subject", "html_body", "text_body")
    @classmethod
    def not_null(cls, value: str | None) -> str:
        if value is None:
            raise ValueError("may not be null")
        return value


class TemplateOut(Out):
    id: str
    name: str
    subject: str
    html_body: str
    text_body: str
    blocks_json: dict[str, Any] | None
    variables: list[str]
    created_at: datetime
    updated_at: datetime


def _out(template: Template) -> dict[str, Any]:
    return TemplateOut.model_validate(template).model_dump(mode="json")


@blueprint.post("/")
@json_body(CreateTemplate)
@document_response(TemplateOut, 201)
async def create(body: CreateTemplate) -> tuple[dict[str, Any], int]:
    created = await templates.create(
        runtime(),
        principal(),
        body.name,
        body.subject,
        body.html_body,
        body.text_body,
        body.blocks_json,
    )
    return _out(created), 201


@blueprint.get("/")
@document_response(list[TemplateOut])
async def list_templates() -> list[dict[str, Any]]:
    return [_out(t) for t in await templates.list_all(runtime(), principal())]


@blueprint.get("/<id:template_id>")
@document_response(TemplateOut)
async def get(template_id: str) -> dict[str, Any]:
    return _out(await templates.get(runtime(), principal(), template_id))


@blueprint.patch("/<id:template_id>")
@json_body(UpdateTemplate)
@document_response(TemplateOut)
async def update(template_id: str, body: UpdateTemplate) -> dict[str, Any]:
    changes = {name: getattr(body, name) for name in body.model_fields_set}
    return _out(await templates.update(runtime(), principal(), template_id, changes))


@blueprint.delete("/<id:template_id>")
async def delete(template_id: str) -> Response:
    await templates.delete(runtime(), principal(), template_id)
    return Response(b"", status=204)


@blueprint.post("/<id:template_id>/duplicate")
@document_response(TemplateOut, 201)
async def duplicate(template_id: str) -> tuple[dict[str, Any], int]:
    return _out(await templates.duplicate(runtime(), principal(), template_id)), 201
