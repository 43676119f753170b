"""Schemathesis against the service's own OpenAPI document (issue 14): no operation answers a
5xx, whether the request fits the operation's schema or not.

Every operation of `/openapi.json` gets a fixed budget of generated requests, some valid by its
schema and some not (Schemathesis' positive and negative modes), derandomized, authenticated
with the API key of a Pro account. Only "no 5xx" is checked (`not_a_server_error`), not that
the answers match their documented schemas.

The service would call out in one place: the URL of a webhook or a forward. Every generated
`url` and `destination_urls` is pointed at the harness's HTTPS receiver before the request is
sent, so nothing leaves loopback (names in other fields, such as domains and addresses, go to
the test DNS server, which knows none of them). No operation is left out: logging out with an
API key ends nothing (engine.accounts.logout), and DELETE /v1/api-keys/{key_id} is sent random
ids, never the id of the key in use — the test checks that key still works at the end.

Schemathesis' pytest plugin needs the schema when tests are collected, before the service
runs, so its Python API drives the run: one bounded Hypothesis run per operation in a worker
thread, where `Case.call` sends with requests (blocking that thread) while the service answers
in the test's Trio run.
"""

from __future__ import annotations

from typing import Any

import requests
import schemathesis
from schemathesis.checks import not_a_server_error
from schemathesis.core.result import Ok
from schemathesis.generation import GenerationMode

from tests.harness.fuzz import assert_alive_without_faults, run_examples
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.service import Service

EXAMPLES_PER_OPERATION = 4


def point_targets_at(receiver: str, body: Any) -> None:
    """Make every URL the service would POST to in `body` the receiver's (in place); a value
    of another type is left as drawn, for the service to refuse."""
    if not isinstance(body, dict):
        return
    if isinstance(body.get("url"), str):
        body["url"] = receiver
    urls = body.get("destination_urls")
    if isinstance(urls, list):
        body["destination_urls"] = [receiver if isinstance(url, str) else url for url in urls]


async def test_no_operation_of_the_openapi_document_answers_a_server_error(
    service: Service, https_receiver: HttpsReceiver
) -> None:
    account = await service.account("pro")
    document = (await service.client().get("/openapi.json")).json()
    results = list(schemathesis.openapi.from_dict(document).get_all_operations())
    operations = [result.ok() for result in results if isinstance(result, Ok)]
    assert len(operations) == len(results), "every operation of the document can be generated"
    labels = {operation.label for operation in operations}
    assert {"POST /v1/webhooks/", "PATCH /v1/forwards/{forward_id}", "POST /v1/emails/"} <= labels
    auth = {"Authorization": f"Bearer {account.api_key}"}

    with requests.Session() as session:

        def answered_without_a_server_error(case: schemathesis.Case[Any]) -> None:
            point_targets_at(https_receiver.url, case.body)
            response = case.call(base_url=service.url, session=session, headers=auth, timeout=30)
            case.validate_response(response, checks=[not_a_server_error])

        for operation in operations:
            cases = operation.as_strategy(GenerationMode.POSITIVE) | operation.as_strategy(
                GenerationMode.NEGATIVE
            )
            await run_examples(
                cases, answered_without_a_server_error, max_examples=EXAMPLES_PER_OPERATION
            )

    assert (await account.client.get("/v1/api-keys/")).status_code == 200
    await assert_alive_without_faults(service)
