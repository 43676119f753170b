"""The `/openapi.json` quart-schema builds, with the error responses each operation can give.

Every error has one body (`Error`, api/errors.py), so the errors are declared here once rather
than on each route: most follow from what a route is (authenticated: 401; an unsafe method a
session may call: 403 for a foreign Origin; a path id: 404; a JSON body: 413, 415, 422; a
query model: 422), and the rest, the refusals particular to a route (plan gates, conflicts,
rate limits), are listed in `DECLARED` by endpoint. Operation ids are made unique. Files (the console's assets) are not API
operations and are left out.
"""

from __future__ import annotations

from typing import Any

from quart_schema.openapi import OpenAPIProvider
from quart_schema.validation import (
    QUART_SCHEMA_QUERYSTRING_ATTRIBUTE,
    QUART_SCHEMA_REQUEST_ATTRIBUTE,
)
from werkzeug.routing import Rule

ERROR_SCHEMA = {
    "type": "object",
    "description": "The body of every error.",
    "required": ["code", "detail"],
    "properties": {
        "code": {"type": "string", "description": "snake_case, stable: branch on it"},
        "detail": {"type": "string", "description": "what went wrong, for people"},
        "errors": {
            "type": "array",
            "description": "validation problems (code validation_error)",
            "items": {
                "type": "object",
                "required": ["loc", "msg"],
                "properties": {
                    "loc": {"type": "array", "items": {"type": ["string", "integer"]}},
                    "msg": {"type": "string"},
                },
            },
        },
    },
    "additionalProperties": True,  # e.g. `blockers` on broadcasts_in_flight
}

MEANING = {
    400: "The request cannot be carried out as asked (see `code`).",
    401: "Missing or invalid credentials (code unauthorized).",
    403: "Not allowed: the plan's gate or limit (plan_feature, plan_limit), the caller's role,"
    " or a session request whose Origin is not the service's (csrf_failed).",
    404: "Not found, or not this workspace's (code not_found).",
    409: "Conflicts with the current state of the resource (see `code`).",
    410: "No longer available (code expired).",
    413: "The body is too large (code payload_too_large).",
    415: "The body is not JSON (code unsupported_media_type).",
    422: "The request failed validation (code validation_error, `errors` lists each problem).",
    429: "Too many requests (code rate_limited); try again after `Retry-After` seconds.",
}

# The refusals particular to a route, by endpoint (blueprint.function), beyond those its
# shape implies; tests/test_openapi.py checks that each names a route that exists.
DECLARED: dict[str, tuple[int, ...]] = {
    "health.metrics": (401,),
    "tracking.clicked": (400, 404),
    "tracking.opened": (404,),
    "tracking.unsubscribe_page": (400,),
    "tracking.unsubscribe": (400,),
    "sessions.login": (401, 429),
    "sessions.reauth": (401, 429),
    "api_keys.create": (403,),
    "domains.create": (403, 409),
    "domains.verify": (409,),
    "senders.create": (409,),
    "emails.send": (400, 403, 409),
    "emails.send_batch": (400, 403, 409),
    "emails.retry": (403, 409),
    "emails.send_now": (409, 422),
    "emails.replace_saved_searches": (400,),
    "verify.verify": (429,),
    "bimi.status": (403,),
    "bimi.upload": (400, 403, 413),
    "bimi.enable": (400, 403),
    "forwards.create": (400, 403, 409),
    "forwards.update": (400, 403, 409),
    "smtp_credentials.create": (400, 403, 409),
    "contacts.create": (403,),
    "contacts.add_contact": (403, 409),
    "contacts.upload": (400, 403, 413, 422),
    "contacts.send": (400, 403, 409),
    "templates.create": (403,),
    "templates.update": (403,),
    "templates.duplicate": (403,),
    "templates.list_templates": (403,),
    "templates.get": (403,),
    "templates.delete": (403,),
    "webhooks.replay": (409,),
    "transfers.initiate": (409, 429),
    "transfers.accept_by_token": (403, 409, 410, 422),
    "transfers.accept_by_id": (403, 409, 410, 422),
    "transfers.decline": (403, 409),
    "transfers.cancel": (409,),
    "transfers.stop": (409,),
    "admin.force_transfer": (403, 409),
    "egress.list_sources": (403,),
    "egress.get_source": (403,),
    "egress.create_source": (409,),
    "egress.update_source": (409,),
    "egress.delete_source": (409,),
    "egress.list_pools": (403,),
    "egress.get_pool": (403,),
    "egress.create_pool": (404, 409),
    "egress.update_pool": (409,),
    "egress.delete_pool": (409,),
    "egress.workspace_pool": (403,),
    "egress.domain_pool": (403,),
    "nodes.list_nodes": (403,),
    "sandbox.switch": (403, 409),
    "sandbox.mark_verified": (403,),
    "sandbox.create_test_key": (403,),
    "mcp_policy.update": (403,),
}

_UNSAFE = frozenset({"POST", "PUT", "PATCH", "DELETE"})


def _implied(rule: Rule, view: Any) -> set[int]:
    """The errors a route gives by its shape (see the module's header)."""
    statuses: set[int] = set()
    authenticated = rule.rule.startswith("/v1/") and not getattr(view, "_postroom_public", False)
    if authenticated:
        statuses.add(401)
        if _UNSAFE & set(rule.methods or ()):
            statuses.add(403)
    if rule.arguments:
        statuses.add(404)
    if getattr(view, QUART_SCHEMA_REQUEST_ATTRIBUTE, None) is not None:
        statuses |= {413, 415, 422}
    if getattr(view, QUART_SCHEMA_QUERYSTRING_ATTRIBUTE, None) is not None:
        statuses.add(422)
    return statuses


def _error_response(status: int) -> dict[str, Any]:
    response: dict[str, Any] = {
        "description": MEANING[status],
        "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
    }
    if status == 429:
        response["headers"] = {
            "Retry-After": {"description": "seconds to wait", "schema": {"type": "integer"}}
        }
    return response


class ErrorDocumentingProvider(OpenAPIProvider):
    """quart-schema's provider, adding each operation's error responses and the Error schema."""

    def generate_rules(self) -> Any:
        return (rule for rule in super().generate_rules() if not rule.endpoint.endswith("static"))

    def operation_id(self, method: str, path: str, func: Any) -> str:
        # quart-schema names an operation by method and function alone, and many resources
        # have a `create`; the module (the resource) makes the name unique, as OpenAPI asks
        resource = func.__module__.rsplit(".", 1)[-1]
        return f"{method.lower()}_{resource}_{func.__name__}"

    def build_paths(self, rule: Rule) -> tuple[dict[str, Any], dict[str, Any]]:
        paths, components = super().build_paths(rule)
        view = self._app.view_functions[rule.endpoint]
        statuses = _implied(rule, view) | set(DECLARED.get(rule.endpoint, ()))
        for operations in paths.values():
            for method, operation in operations.items():
                # quart-schema shares one `responses` dict among a rule's methods (copy
                # it) and keys it by int; the document's keys are strings
                responses = {str(code): r for code, r in operation["responses"].items()}
                for status in sorted(statuses):
                    responses[str(status)] = _error_response(status)
                if not any(code.startswith("2") for code in responses):
                    responses["204" if method == "delete" else "200"] = {"description": "Success."}
                operation["responses"] = responses
        if statuses:
            components["Error"] = ERROR_SCHEMA
        return paths, components
