"""Templates: Starter plan and above, up to the plan's number, with extracted variables.

`variables` is never taken from the client: it is extracted (engine/templates/variables.py) from
html_body and text_body, as the spec says, each time either changes. A duplicate is named
`<name> (copy)` (docs/architecture.md section 7) and counts against the plan's limit like any
new template.
`fill` completes a send request from a template (`template_id` + `variables` on /v1/emails).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, ClassVar, Protocol, TypeVar

from engine import plans
from engine.activity import Change, record
from engine.mail.unsubscribe_footer import subject_problem
from engine.platform.errors import NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.templates.variables import extract, render, render_subject
from storage import templates
from storage.codec import new_id
from storage.templates import Template
from storage.tx import Tx


def _require_plan(who: Principal) -> None:
    plan = plans.plan(who.plan)
    plans.require(plan.templates != 0, "Templates", plan.name)


def _check_room(tx: Tx, who: Principal) -> None:
    plan = plans.plan(who.plan)
    plans.check_workspace_room(
        tx, who.workspace_id, plan.templates, templates.count, "templates", plan.name
    )


def _check_subject(subject: str | None) -> None:
    """Unprocessable if the subject places the unsubscribe link
    (engine/mail/unsubscribe_footer.py)."""
    if problem := subject_problem(subject):
        raise Unprocessable(problem, errors=[{"loc": ["body", "subject"], "msg": problem}])


def _with_variables(template: Template) -> Template:
    """The template with the variables its bodies use."""
    return replace(template, variables=extract(template.html_body, template.text_body))


def _found(tx: Tx, who: Principal, template_id: str) -> Template:
    template = templates.get(tx, who.workspace_id, template_id)
    if template is None:
        raise NotFound("template not found")
    return template


def _log(tx: Tx, who: Principal, action: str, template: Template, now: datetime) -> None:
    record(tx, who.workspace_id, who.user_email, Change(action, template.name, template.id), now)


def _create(tx: Tx, who: Principal, template: Template) -> Template:
    _check_room(tx, who)
    templates.insert(tx, template)
    _log(tx, who, "template.created", template, template.created_at)
    return template


async def create(
    rt: Runtime,
    who: Principal,
    name: str,
    subject: str,
    html_body: str,
    text_body: str,
    blocks_json: dict[str, Any] | None,
) -> Template:
    """A new template; PlanFeature below Starter, PlanLimit when the plan's limit is reached."""
    _require_plan(who)
    now = rt.clock.now()
    template = Template(
        new_id(), who.workspace_id, name, subject, html_body, text_body, blocks_json, [], now, now
    )
    _check_subject(subject)
    return await rt.db.write(_create, who, _with_variables(template))


async def list_all(rt: Runtime, who: Principal) -> list[Template]:
    """The workspace's templates, most recently updated first."""
    _require_plan(who)
    return await rt.db.read(templates.list_all, who.workspace_id)


async def get(rt: Runtime, who: Principal, template_id: str) -> Template:
    _require_plan(who)
    return await rt.db.read(_found, who, template_id)


def _update(
    tx: Tx, who: Principal, template_id: str, changes: dict[str, Any], now: datetime
) -> Template:
    current = _found(tx, who, template_id)
    if "subject" in changes:  # a subject saved before the rule stays editable around it
        _check_subject(changes["subject"])
    updated = _with_variables(replace(current, **changes, updated_at=now))
    templates.update(tx, updated)
    _log(tx, who, "template.updated", updated, now)
    return updated


async def update(
    rt: Runtime, who: Principal, template_id: str, changes: dict[str, Any]
) -> Template:
    """Change the supplied fields (name, subject, html_body, text_body, blocks_json)."""
    _require_plan(who)
    return await rt.db.write(_update, who, template_id, changes, rt.clock.now())


def _delete(tx: Tx, who: Principal, template_id: str, now: datetime) -> None:
    template = _found(tx, who, template_id)
    templates.delete(tx, who.workspace_id, template.id)
    _log(tx, who, "template.deleted", template, now)


async def delete(rt: Runtime, who: Principal, template_id: str) -> None:
    _require_plan(who)
    await rt.db.write(_delete, who, template_id, rt.clock.now())


def _duplicate(tx: Tx, who: Principal, template_id: str, now: datetime) -> Template:
    original = _found(tx, who, template_id)
    _check_room(tx, who)
    copy = replace(
        original, id=new_id(), name=f"{original.name} (copy)", created_at=now, updated_at=now
    )
    templates.insert(tx, copy)
    _log(tx, who, "template.duplicated", copy, now)
    return copy


async def duplicate(rt: Runtime, who: Principal, template_id: str) -> Template:
    """A copy named `<name> (copy)` with a new id and timestamps."""
    _require_plan(who)
    return await rt.db.write(_duplicate, who, template_id, rt.clock.now())


class Draft(Protocol):
    """What a template completes: a dataclass with these fields (a send request,
    engine/sending/intake.py `SendRequest`; sending builds on templates, not the other way)."""

    __dataclass_fields__: ClassVar[dict[str, Any]]

    @property
    def subject(self) -> str: ...
    @property
    def html(self) -> str | None: ...
    @property
    def text(self) -> str | None: ...


D = TypeVar("D", bound=Draft)


async def fill(
    rt: Runtime, who: Principal, req: D, template_id: str, variables: Mapping[str, Any]
) -> D:
    """A send request completed from a template: the subject, html and text it leaves out
    (empty or absent) rendered with `variables` (values HTML-escaped in html)."""
    template = await get(rt, who, template_id)
    html = render(template.html_body, variables, escape_html=True)
    text = render(template.text_body, variables)
    return replace(
        req,
        subject=req.subject or render_subject(template.subject, variables),
        html=req.html if req.html is not None else html or None,
        text=req.text if req.text is not None else text or None,
    )
