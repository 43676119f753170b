"""API keys: the active keys, a new key (shown once), delete; in sandbox mode, test keys
(`svc_k_test_…`), which act only while the workspace is in the sandbox."""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response, request

from api.errors import status_of
from api.routes.api_keys import CreateApiKey
from console.web import form, go, page, parse, problems_of, rt, who
from engine.accounts import api_keys
from engine.accounts.api_keys import CreatedKey
from engine.platform.errors import EngineError
from engine.sandbox import keys as test_keys
from engine.sandbox import mode as sandbox

blueprint = Blueprint("keys", __name__)


async def _index(status: int = 200, **extra: Any) -> Response:
    found = await api_keys.list_active(rt(), who())
    state = await sandbox.state(rt(), who())
    extra.setdefault("problems", {})
    extra.setdefault("values", {})
    done = {"deleted": "Key deleted: it stops working at once."}.get(request.args.get("done", ""))
    return await page(
        "keys.html",
        status=status,
        title="API keys",
        keys=found,
        sandboxed=state.enabled,
        notice=done,
        public_url=rt().public_url,
        **extra,
    )


@blueprint.get("/api-keys")
async def index() -> Response:
    return await _index()


@blueprint.post("/api-keys")
async def create() -> Response:
    values = await form()
    body, problems = parse(CreateApiKey, {"name": values.get("name", "")})
    if body is None:
        return await _index(422, values=values, problems=problems)
    created: CreatedKey
    try:
        if values.get("test"):
            created = await test_keys.create(rt(), who(), body.name)
        else:
            created = await api_keys.create(rt(), who(), body.name, None)
    except EngineError as exc:
        return await _index(status_of(exc), values=values, problems=problems_of(exc))
    return await _index(created=created)


@blueprint.post("/api-keys/<id:key_id>/delete")
async def delete(key_id: str) -> Response:
    await api_keys.delete(rt(), who(), key_id)
    return go("console.keys.index", done="deleted")
