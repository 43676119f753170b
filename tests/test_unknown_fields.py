"""No typo is a silent no-op: a field, query parameter or search token the service does not
know is a 422 naming it (and the closest known name), never ignored.

Through every door: the API (both paths of `POST /v1/emails/`: the send edge and Quart), the
console's email log, and the MCP door's tools.
"""

from __future__ import annotations

from typing import Any

import httpx

from tests.harness.dns_server import DnsServer
from tests.harness.mcp import call, draft, logged_in, mcp_client, refused
from tests.harness.sending import ready_account
from tests.harness.service import PUBLIC_URL, Account, Service

POLICIES = "/v1/delivery/policies"


def unknown(response: httpx.Response, loc: list[Any], *named: str) -> str:
    """The one problem of a 422 for an unknown name at `loc`; its message names `named`."""
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["code"] == "validation_error"
    [problem] = [p for p in body["errors"] if p["loc"] == loc]
    message: str = problem["msg"]
    for name in named:
        assert repr(name) in message, (name, message)
    return message


async def test_misspelt_fields_and_parameters_are_refused_and_change_nothing(
    service: Service,
) -> None:
    account = await service.account("starter")
    before = (await account.client.get(POLICIES)).json()
    body = {"match": "x.example", "messages_per_minute": 30}
    response = await account.client.post(POLICIES, json=body)
    message = unknown(response, ["body", "messages_per_minute"], "messages_per_minute")
    assert "did you mean 'per_minute'?" in message
    assert (await account.client.get(POLICIES)).json() == before
    created = await account.client.post(POLICIES, json={"match": "x.example", "per_minute": 30})
    assert (created.status_code, created.json()["per_minute"]) == (201, 30)

    person = await logged_in(service, account)
    unknown(await person.patch("/v1/mcp/policy", json={"mode": "send"}), ["body", "mode"], "mode")
    assert (await account.client.get("/v1/mcp/policy")).json()["policy"] == "read"

    response = await account.client.get("/v1/emails/", params={"stauts": "bounced"})
    assert "did you mean 'status'?" in unknown(response, ["query", "stauts"], "stauts")


async def test_both_paths_of_sending_refuse_an_unknown_field_and_send_nothing(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    person = await logged_in(service, account)  # a session cookie: Quart's route, not the edge
    mistyped = {**draft(["ann@customer.example"]), "reply_too": {"email": "me@customer.example"}}
    nested = draft(["ann@customer.example"])
    nested["to"][0]["emial"] = nested["to"][0].pop("email")
    for client in (account.client, person):
        message = unknown(
            await client.post("/v1/emails/", json=mistyped), ["body", "reply_too"], "reply_too"
        )
        assert "did you mean 'reply_to'?" in message
        message = unknown(
            await client.post("/v1/emails/", json=nested), ["body", "to", 0, "emial"], "emial"
        )
        assert "did you mean 'email'?" in message
    batch = await account.client.post("/v1/emails/batch", json=[mistyped])
    assert batch.status_code == 202, batch.text
    [entry] = batch.json()
    assert entry["status"] == "error" and "'reply_to'" in entry["rejection_reason"]
    assert (await account.client.get("/v1/emails/")).json() == []


async def test_unknown_search_tokens_and_impossible_statuses_are_named_in_every_door(
    service: Service,
) -> None:
    account: Account = await service.account()
    search = "/v1/emails/search"
    cases: list[tuple[dict[str, str], list[Any], str]] = [
        ({"q": "status:foo"}, ["query", "q"], "foo"),
        ({"q": "source:mcp"}, ["query", "q"], "source:"),
        ({"q": "Invoice stauts:bounced"}, ["query", "q"], "stauts:"),
        ({"status": "bounce"}, ["query", "status"], "bounce"),
    ]
    for params, loc, named in cases:
        unknown(await account.client.get(search, params=params), loc, named)
    assert "'status:'" in (await account.client.get(search, params={"q": "stauts:x"})).text
    # Free text keeps its colons when quoted, and in words that are no token.
    for q in ('"Invoice:123"', "Re: receipt", "https://example.com/x", "10:30", "status:Bounced"):
        answered = await account.client.get(search, params={"q": q})
        assert (answered.status_code, answered.json()) == (200, []), q

    console = service.client(headers={"Origin": PUBLIC_URL})
    credentials = {"email": account.email, "password": account.password}
    assert (await console.post("/v1/auth/login", json=credentials)).status_code == 200
    page = await console.get("/emails", params={"q": "status:foo source:mcp"})
    assert page.status_code == 422
    assert "unknown status &#39;foo&#39;" in page.text and "No email matches" not in page.text

    async with mcp_client(service, account.api_key) as client:
        error = await refused(client, "search_emails", q="status:foo source:mcp")
        assert error["code"] == "validation_error"
        assert error["errors"][0]["loc"] == ["arguments", "q"] and "'foo'" in error["detail"]
        error = await refused(client, "search_emails", stauts="bounced")
        assert error["errors"][0]["loc"] == ["arguments", "stauts"]
        assert "did you mean 'status'?" in error["detail"]
        assert (await call(client, "search_emails", q="status:bounced"))["emails"] == []


def _open_objects(schema: Any, components: dict[str, Any], seen: set[str]) -> list[str]:
    """Objects with named properties under `schema` that would accept other properties."""
    found: list[str] = []
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str):
            name = ref.rsplit("/", 1)[-1]
            if name not in seen:
                seen.add(name)
                found += _open_objects(components[name], components, seen)
        if "properties" in schema and schema.get("additionalProperties") is not False:
            found.append(str(schema.get("title", sorted(schema["properties"]))))
        for value in schema.values():
            found += _open_objects(value, components, seen)
    elif isinstance(schema, list):
        for item in schema:
            found += _open_objects(item, components, seen)
    return found


async def test_every_documented_request_body_refuses_unknown_fields(service: Service) -> None:
    document = (await service.client().get("/openapi.json")).json()
    components = document["components"]["schemas"]
    open_bodies = []
    bodies = 0
    for path, operations in document["paths"].items():
        for method, operation in operations.items():
            content = operation.get("requestBody", {}).get("content", {})
            for media in content.values():
                bodies += 1
                for name in _open_objects(media["schema"], components, set()):
                    open_bodies.append(f"{method.upper()} {path}: {name}")
    assert bodies > 30
    assert open_bodies == []
