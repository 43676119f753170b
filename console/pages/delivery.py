"""Delivery control on one page: destination policies, warm-up ramps, destination incidents
and queue actions by search (a dry run first, then the real one); a policy and a ramp each have
a page of their own to change it on.

Each form is read with the API's own request model (api/routes/delivery.py, queue.py) and
calls the engine function the API calls (engine/delivery/controls.py, incidents.py,
engine/sending/queue_actions.py), so the rules and the errors are the API's.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.delivery import CreatePolicy, CreateRamp, UpdateRamp, ramp_out
from api.routes.queue import QueueAction
from console.web import form, go, page, parse, problems_of, rt, who
from engine.delivery import controls, incidents, policies
from engine.delivery.controls import PolicyChange
from engine.domains import registry
from engine.platform.errors import EngineError
from engine.sending import queue_actions
from storage.delivery_policies import LIMIT_FIELDS

blueprint = Blueprint("delivery", __name__)

DONE = {
    "policy": "Destination policy created.",
    "policy_deleted": "Destination policy deleted.",
    "policy_changed": "Destination policy changed.",
    "ramp_changed": "Warm-up ramp changed.",
    "ramp": "Warm-up ramp created.",
    "ramp_deleted": "Warm-up ramp deleted.",
    "resolved": "Incident resolved: the destination is open again.",
}
RECENT_INCIDENTS = 50


def _given(fields: dict[str, str], names: tuple[str, ...]) -> dict[str, str]:
    """The form's fields, an empty one left out (as an API client would leave it out)."""
    return {
        name: value.strip() for name, value in fields.items() if name in names and value.strip()
    }


async def _index(status: int = 200, section: str = "", **extra: Any) -> Response:
    """The page; `section` names the form whose `problems` and `values` these are (each form
    shows only its own, the whole form's problem shows at the top)."""
    runtime, principal = rt(), who()
    domains = await registry.list_all(runtime, principal)
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    return await page(
        "delivery.html",
        status=status,
        title="Delivery",
        policies=await controls.list_policies(runtime, principal),
        precedence=policies.PRECEDENCE,
        limit_fields=LIMIT_FIELDS,
        ramps=[ramp_out(r) for r in await controls.list_ramps(runtime, principal)],
        incidents=await incidents.listed(runtime, principal, "all", RECENT_INCIDENTS),
        domains={d.id: d.name for d in domains},
        actions=[(a, a.replace("_", " ")) for a in queue_actions.ACTIONS],
        notice=DONE.get(request.args.get("done", "")),
        section=section,
        **extra,
    )


@blueprint.get("/delivery")
async def index() -> Response:
    return await _index()


POLICY_FIELDS = ("match", "domain_id", *LIMIT_FIELDS)


def _whole_policy(body: CreatePolicy) -> PolicyChange:
    """A policy form as the change it makes: every field given (a form is the whole policy)."""
    return PolicyChange(
        match=body.match,
        domain_id=body.domain_id,
        domain_given=True,
        limits={name: getattr(body, name) for name in LIMIT_FIELDS},
    )


@blueprint.post("/delivery/policies")
async def create_policy() -> Response:
    values = _given(await form(), POLICY_FIELDS)
    body, problems = parse(CreatePolicy, values)
    if body is None:
        return await _index(422, "policy", problems=problems, values=values)
    try:
        await controls.create_policy(rt(), who(), _whole_policy(body))
    except EngineError as exc:
        return await _index(status_of(exc), "policy", problems=problems_of(exc), values=values)
    return go("console.delivery.index", done="policy")


async def _policy_page(
    policy_id: str, values: dict[str, str] | None = None, status: int = 200, **extra: Any
) -> Response:
    """The page changing one policy: its form holds `values`, or the policy as it is."""
    runtime, principal = rt(), who()
    rule = await controls.get_policy(runtime, principal, policy_id)
    if values is None:
        values = {"match": rule.match, "domain_id": rule.domain_id or ""}
        values |= {n: str(getattr(rule, n)) for n in LIMIT_FIELDS if getattr(rule, n) is not None}
    domains = await registry.list_all(runtime, principal)
    extra.setdefault("problems", {})
    return await page(
        "delivery_policy.html",
        status=status,
        title=f"Policy for {rule.match}",
        rule=rule,
        values=values,
        limit_fields=LIMIT_FIELDS,
        domains={d.id: d.name for d in domains},
        **extra,
    )


@blueprint.get("/delivery/policies/<id:policy_id>")
async def policy(policy_id: str) -> Response:
    return await _policy_page(policy_id)


@blueprint.post("/delivery/policies/<id:policy_id>")
async def change_policy(policy_id: str) -> Response:
    """The whole form is the policy: a limit left empty is cleared, as null clears it in a
    PATCH, and an empty sending domain makes it apply to every one."""
    values = _given(await form(), POLICY_FIELDS)
    body, problems = parse(CreatePolicy, values)
    if body is None:
        return await _policy_page(policy_id, values, 422, problems=problems)
    try:
        await controls.update_policy(rt(), who(), policy_id, _whole_policy(body))
    except EngineError as exc:
        return await _policy_page(policy_id, values, status_of(exc), problems=problems_of(exc))
    return go("console.delivery.index", done="policy_changed")


@blueprint.post("/delivery/policies/<id:policy_id>/delete")
async def delete_policy(policy_id: str) -> Response:
    try:
        await controls.delete_policy(rt(), who(), policy_id)
    except EngineError as exc:
        return await _index(status_of(exc), problems=problems_of(exc))
    return go("console.delivery.index", done="policy_deleted")


@blueprint.post("/delivery/ramps")
async def create_ramp() -> Response:
    fields = await form()
    values = _given(fields, ("domain_id", "first_day", "factor", "target_per_day", "starts_on"))
    body, problems = parse(CreateRamp, values)
    if body is None:
        return await _index(422, "ramp", problems=problems, values=values)
    try:
        await controls.create_ramp(
            rt(),
            who(),
            body.domain_id,
            body.first_day,
            body.factor,
            body.target_per_day,
            body.starts_on,
        )
    except EngineError as exc:
        return await _index(status_of(exc), "ramp", problems=problems_of(exc), values=values)
    return go("console.delivery.index", done="ramp")


RAMP_FIELDS = ("first_day", "factor", "target_per_day", "starts_on")


async def _ramp_page(
    ramp_id: str, values: dict[str, str] | None = None, status: int = 200, **extra: Any
) -> Response:
    """The page changing one ramp: its form holds `values`, or the ramp as it is."""
    runtime, principal = rt(), who()
    ramp = ramp_out(await controls.get_ramp(runtime, principal, ramp_id))
    if values is None:
        values = {name: str(ramp[name]) for name in RAMP_FIELDS}
    domains = {d.id: d.name for d in await registry.list_all(runtime, principal)}
    name = domains.get(ramp["domain_id"], ramp["domain_id"])
    extra.setdefault("problems", {})
    return await page(
        "delivery_ramp.html",
        status=status,
        title=f"Warm-up ramp of {name}",
        ramp=ramp,
        domain_name=name,
        values=values,
        **extra,
    )


@blueprint.get("/delivery/ramps/<id:ramp_id>")
async def ramp(ramp_id: str) -> Response:
    return await _ramp_page(ramp_id)


@blueprint.post("/delivery/ramps/<id:ramp_id>")
async def change_ramp(ramp_id: str) -> Response:
    """Every field of the form is the ramp's: none may be left empty."""
    values = _given(await form(), RAMP_FIELDS)
    missing = {name: "required" for name in RAMP_FIELDS if name not in values}
    body, problems = parse(UpdateRamp, values)
    if body is None or missing:
        return await _ramp_page(ramp_id, values, 422, problems={**missing, **problems})
    fields = {name: getattr(body, name) for name in RAMP_FIELDS}
    try:
        await controls.update_ramp(rt(), who(), ramp_id, fields)
    except EngineError as exc:
        return await _ramp_page(ramp_id, values, status_of(exc), problems=problems_of(exc))
    return go("console.delivery.index", done="ramp_changed")


@blueprint.post("/delivery/ramps/<id:ramp_id>/delete")
async def delete_ramp(ramp_id: str) -> Response:
    await controls.delete_ramp(rt(), who(), ramp_id)
    return go("console.delivery.index", done="ramp_deleted")


@blueprint.post("/delivery/incidents/<id:incident_id>/resolve")
async def resolve_incident(incident_id: str) -> Response:
    try:
        await incidents.resolve(rt(), who(), incident_id)
    except EngineError as exc:
        return await _index(status_of(exc), problems=problems_of(exc))
    return go("console.delivery.index", done="resolved")


@blueprint.post("/delivery/queue")
async def queue_action() -> Response:
    """A queue action by search: `dry_run` (the button pressed) counts what it would take;
    the page then offers the real action for the same search."""
    fields = await form()
    values = {"q": fields.get("q", ""), "action": fields.get("action", "")}
    body, problems = parse(QueueAction, {**values, "dry_run": fields.get("dry_run", "false")})
    if body is None:
        return await _index(422, "queue", problems=problems, values=values)
    try:
        touched = await queue_actions.act(rt(), who(), body.q, body.action, body.dry_run)
    except EngineError as exc:
        return await _index(status_of(exc), "queue", problems=problems_of(exc), values=values)
    verb = "would take" if body.dry_run else "took"
    said = (
        f"{body.action} {verb} {touched.recipients} recipient(s) of {touched.emails} email(s)"
        f"{' (dry run: nothing changed)' if body.dry_run else ''}."
    )
    return await _index(section="queue", values=values, queue_result=said, dry_run=body.dry_run)
