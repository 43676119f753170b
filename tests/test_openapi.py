"""`/openapi.json` is a valid OpenAPI 3.1 document whose operations document their errors.

The document is checked by openapi-spec-validator (a pinned dev dependency); errors the
service really answers are checked against what the document says of that operation.
"""

from __future__ import annotations

import importlib
import uuid
from typing import Any

import httpx
import jsonschema
from openapi_spec_validator import validate

from api.openapi import DECLARED, OPERATIONS, SUCCESS, TAGS
from tests.harness.service import Service
from tests.harness.sessions import signed_in_client

# No input and no credential: nothing a client can get wrong (503 when degraded is a 5xx).
NO_CLIENT_ERROR = {("get", "/healthz")}


async def _document(service: Service) -> dict[str, Any]:
    response = await service.client().get("/openapi.json")
    assert response.status_code == 200
    document: dict[str, Any] = response.json()
    return document


def _operations(document: dict[str, Any]) -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (method, path, operation)
        for path, operations in document["paths"].items()
        for method, operation in operations.items()
    ]


async def test_the_document_is_valid_openapi(service: Service) -> None:
    document = await _document(service)
    validate(document)  # raises OpenAPIValidationError with the path of the first problem
    assert document["openapi"].startswith("3.1")


async def test_every_operation_documents_its_errors_with_the_error_body(service: Service) -> None:
    document = await _document(service)
    error_ref = {"$ref": "#/components/schemas/Error"}
    assert document["components"]["schemas"]["Error"]["required"] == ["code", "detail"]
    operations = _operations(document)
    assert len(operations) > 90
    undocumented = []
    for method, path, operation in operations:
        errors = {
            status: response
            for status, response in operation["responses"].items()
            if status.startswith("4")
        }
        for status, response in errors.items():
            assert response["content"]["application/json"]["schema"] == error_ref, (path, status)
        if not errors and (method, path) not in NO_CLIENT_ERROR:
            undocumented.append(f"{method.upper()} {path}")
        assert any(status[0] in "23" for status in operation["responses"]), (method, path)
    assert undocumented == []
    send = document["paths"]["/v1/emails/"]["post"]["responses"]
    assert {"401", "403", "409", "413", "422"} <= set(send)
    assert "429" in document["paths"]["/v1/auth/login"]["post"]["responses"]
    assert (
        "Retry-After" in document["paths"]["/v1/auth/login"]["post"]["responses"]["429"]["headers"]
    )


# Paths a caller reaches without a credential: the document must not show them locked.
PUBLIC = {
    ("get", "/healthz"),
    ("get", "/metrics"),  # its own token, when one is set
    ("get", "/t/o/{token}"),
    ("get", "/t/c/{token}"),
    ("get", "/t/u/{token}"),
    ("post", "/t/u/{token}"),
    ("post", "/v1/auth/login"),
    ("post", "/v1/auth/totp/login"),
    ("get", "/v1/bimi/{domain_id}/logo.svg"),
    ("post", "/v1/domain-transfers/stop/{stop_token}"),  # the token is the credential
    ("post", "/v1/workspace/invitations/sign-up"),  # so is the invitation's
}


async def test_every_operation_documents_what_it_answers_on_success(service: Service) -> None:
    """A client generated from the document knows each success's status and body: JSON
    answers have their schema, others their media type, and an empty answer is a 204."""
    document = await _document(service)
    vague = []
    for method, path, operation in _operations(document):
        successes = {s: r for s, r in operation["responses"].items() if s[0] in "23"}
        described = [s for s, r in successes.items() if "content" in r or s in ("204", "302")]
        if not described:
            vague.append(f"{method.upper()} {path}: {sorted(successes)}")
    assert vague == [], "\n".join(vague)
    login = document["paths"]["/v1/auth/login"]["post"]["responses"]
    assert {"200", "202"} <= set(login), login
    logout = document["paths"]["/v1/auth/logout"]["post"]["responses"]
    assert "204" in logout and "200" not in logout, logout


async def test_the_successes_said_by_hand_are_what_the_service_answers(
    service: Service,
) -> None:
    """Two of `SUCCESS`'s entries, answered for real: a sign-out is a 204 with no body, the
    metrics are text."""
    account = await service.account()
    client = await signed_in_client(service, account)
    logout = await client.post("/v1/auth/logout")
    assert (logout.status_code, logout.content) == (SUCCESS["sessions.logout"][0], b"")
    metrics = await service.client().get("/metrics")
    assert metrics.headers["Content-Type"].startswith(SUCCESS["health.metrics"][1] or "")


async def test_the_email_logs_headers_are_documented_where_they_are_answered(
    service: Service,
) -> None:
    """The log's pages keep the spec's array as body; their count, row limit and where the
    updates go on are headers, which a client learns of from the document."""
    document = await _document(service)
    account = await service.account()

    def extra(answer: httpx.Response) -> set[str]:
        return {name.lower() for name in answer.headers if name.lower().startswith("x-")}

    everywhere = extra(await account.client.get("/v1/domains/"))  # security headers and such
    for path, params in (
        ("/v1/emails/", {}),
        ("/v1/emails/search", {}),
        ("/v1/emails/export", {}),
        ("/v1/emails/updates", {"since": "2026-01-01T00:00:00Z"}),
    ):
        answer = await account.client.get(path, params=params)
        assert answer.status_code == 200, answer.text
        answered = extra(answer) - everywhere
        documented = document["paths"][path]["get"]["responses"]["200"].get("headers", {})
        assert answered and answered == {name.lower() for name in documented}, path


async def test_every_operation_has_a_summary_a_description_a_tag_and_its_security(
    service: Service,
) -> None:
    document = await _document(service)
    assert document["components"]["securitySchemes"]["apiKey"]["scheme"] == "bearer"
    public = set()
    for method, path, operation in _operations(document):
        assert operation["summary"].strip(), (method, path)
        assert operation["description"].strip(), (method, path)
        assert operation["description"] != operation["summary"], (method, path)
        [tag] = operation["tags"]
        assert tag in set(TAGS.values()) and tag != "default", (method, path)
        if operation["security"] == []:
            public.add((method, path))
        else:
            assert {"apiKey": []} in operation["security"], (method, path)
    assert public == PUBLIC
    emails = document["paths"]["/v1/emails/"]
    assert emails["post"]["tags"] == ["emails"] and emails["post"]["summary"] == "Send an email"
    assert document["paths"]["/v1/api-keys/"]["get"]["tags"] == ["api-keys"]
    assert document["paths"]["/v1/domains/"]["get"]["tags"] == ["domains"]


def _route_exists(endpoint: str) -> bool:
    blueprint, function = endpoint.split(".")
    module = "incidents" if blueprint == "delivery_incidents" else blueprint
    return callable(getattr(importlib.import_module(f"api.routes.{module}"), function, None))


def test_each_documented_operation_names_a_route_that_exists() -> None:
    for endpoint in OPERATIONS:
        assert _route_exists(endpoint), endpoint
        assert endpoint.split(".")[0] in TAGS, endpoint


def test_each_declared_error_names_a_route_that_exists() -> None:
    for endpoint in DECLARED:
        assert _route_exists(endpoint), endpoint


async def test_errors_the_service_answers_are_documented_for_their_operation(
    service: Service,
) -> None:
    document = await _document(service)
    account = await service.account("free")
    anonymous = service.client()
    answers: list[tuple[str, str, httpx.Response]] = [
        ("get", "/v1/domains/", await anonymous.get("/v1/domains/")),
        (
            "get",
            "/v1/domains/{domain_id}",
            await account.client.get(f"/v1/domains/{uuid.uuid4()}"),
        ),
        ("post", "/v1/emails/", await account.client.post("/v1/emails/", json={"to": []})),
        (
            "post",
            "/v1/emails/",
            await account.client.post(
                "/v1/emails/", content=b"to=a", headers={"Content-Type": "text/plain"}
            ),
        ),
        (
            "post",
            "/v1/templates/",
            await account.client.post(
                "/v1/templates/",
                json={"name": "t", "subject": "s", "html_body": "h", "text_body": "t"},
            ),
        ),
        ("get", "/v1/audit-log", await account.client.get("/v1/audit-log?limit=0")),
    ]
    error_schema = document["components"]["schemas"]["Error"]
    for method, path, answer in answers:
        assert 400 <= answer.status_code < 500, (path, answer.status_code)
        documented = document["paths"][path][method]["responses"]
        assert str(answer.status_code) in documented, (method, path, answer.status_code)
        jsonschema.validate(answer.json(), error_schema)
    assert [a.status_code for _, _, a in answers] == [401, 404, 422, 415, 403, 422]
