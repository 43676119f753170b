"""Templates (Starter plan and above): create, edit, duplicate, delete, and a live preview
that fills the saved template with the variables typed, as a send with `template_id` would
(engine/templates/library.py `fill`)."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.templates import CreateTemplate, UpdateTemplate
from console.web import form, framed_html, go, page, parse, problems_of, rt, who
from engine.platform.errors import EngineError
from engine.sending.intake import Mailbox, SendRequest
from engine.templates import library as templates

blueprint = Blueprint("templates", __name__)

VARIABLE = "var:"  # form fields of the preview's variables
DONE = {
    "created": "Template created.",
    "saved": "Template saved.",
    "duplicated": "Template duplicated.",
    "deleted": "Template deleted.",
}


async def _index(status: int = 200, **extra: Any) -> Response:
    found = await templates.list_all(rt(), who())
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "templates.html",
        status=status,
        title="Templates",
        templates=found,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/templates")
async def index() -> Response:
    return await _index()


@blueprint.post("/templates")
async def create() -> Response:
    values = await form()
    body, problems = parse(CreateTemplate, values)
    if body is None:
        return await _index(422, values=values, problems=problems)
    try:
        created = await templates.create(
            rt(), who(), body.name, body.subject, body.html_body, body.text_body, None
        )
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return go("console.templates.detail", template_id=created.id, done="created")


async def _detail(template_id: str, status: int = 200, **extra: Any) -> Response:
    found = await templates.get(rt(), who(), template_id)
    extra.setdefault("problems", {})
    return await page(
        "template.html",
        status=status,
        title=found.name,
        template=found,
        notice=DONE.get(request.args.get("done", "")),
        **extra,
    )


@blueprint.get("/templates/<id:template_id>")
async def detail(template_id: str) -> Response:
    return await _detail(template_id)


@blueprint.post("/templates/<id:template_id>")
async def update(template_id: str) -> Response:
    values = await form()
    fields: dict[str, Any] = {
        k: values[k] for k in ("name", "subject", "html_body", "text_body") if k in values
    }
    body, problems = parse(UpdateTemplate, fields)
    if body is None:
        return await _detail(template_id, 422, problems=problems)
    try:
        await templates.update(rt(), who(), template_id, fields)
    except EngineError as exc:
        return await _detail(template_id, status_of(exc), problems=problems_of(exc))
    return go("console.templates.detail", template_id=template_id, done="saved")


async def _filled(template_id: str, values: dict[str, str]) -> SendRequest:
    """The template filled with the `var:` fields among `values`."""
    variables = {k.removeprefix(VARIABLE): v for k, v in values.items() if k.startswith(VARIABLE)}
    empty = SendRequest(from_=Mailbox("preview@invalid", None), to=(), subject="")
    return await templates.fill(rt(), who(), empty, template_id, variables)


@blueprint.post("/templates/<id:template_id>/preview")
async def preview(template_id: str) -> Response:
    values = await form()
    filled = await _filled(template_id, values)
    # The frames below read the same variables from their URL (short: names and values).
    shown = {k: v for k, v in values.items() if k.startswith(VARIABLE)}
    return await page("_template_preview.html", filled=filled, variables=shown, id=template_id)


@blueprint.get("/templates/<id:template_id>/preview.html")
async def preview_html(template_id: str) -> Response:
    """The filled template's HTML as a document of its own, for the preview's sandboxed
    frames (the email page's, under the same policy)."""
    filled = await _filled(template_id, request.args.to_dict())
    return framed_html(filled.html or "")


@blueprint.post("/templates/<id:template_id>/duplicate")
async def duplicate(template_id: str) -> Response:
    copy = await templates.duplicate(rt(), who(), template_id)
    return go("console.templates.detail", template_id=copy.id, done="duplicated")


@blueprint.post("/templates/<id:template_id>/delete")
async def delete(template_id: str) -> Response:
    await templates.delete(rt(), who(), template_id)
    return go("console.templates.index", done="deleted")
