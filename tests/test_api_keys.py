"""API keys: create, list, delete, plan caps, and what a deleted key can still do."""

from __future__ import annotations

import trio
from trio.testing import MockClock

from tests.harness.service import Service


async def test_created_key_authenticates_and_is_listed_without_its_secret(service: Service) -> None:
    account = await service.account()
    created = await account.client.post("/v1/api-keys/", json={"name": "deploy"})
    assert created.status_code == 201
    body = created.json()
    assert body["key"].startswith("svc_k_")
    assert body["key_prefix"] == body["key"][len("svc_k_") :][:8]
    assert body["permissions"] == ["send"]

    new_client = service.client(headers={"Authorization": f"Bearer {body['key']}"})
    listed = await new_client.get("/v1/api-keys/")
    assert listed.status_code == 200
    by_id = {item["id"]: item for item in listed.json()}
    assert set(by_id[body["id"]]) == {
        "id",
        "name",
        "key_prefix",
        "permissions",
        "is_active",
        "last_used_at",
        "created_at",
    }
    assert by_id[body["id"]]["is_active"] is True
    assert body["key"] not in listed.text


async def test_last_used_at_is_set_once_a_key_is_used(service: Service) -> None:
    account = await service.account()
    created = (await account.client.post("/v1/api-keys/", json={"name": "ci"})).json()
    before = {k["id"]: k for k in (await account.client.get("/v1/api-keys/")).json()}
    assert before[created["id"]]["last_used_at"] is None
    other = service.client(headers={"Authorization": f"Bearer {created['key']}"})
    assert (await other.get("/v1/audit-log")).status_code == 200
    after = {k["id"]: k for k in (await account.client.get("/v1/api-keys/")).json()}
    assert after[created["id"]]["last_used_at"] is not None


async def test_free_plan_caps_active_keys_at_two(service: Service) -> None:
    account = await service.account("free")  # holds its first key already
    assert (await account.client.post("/v1/api-keys/", json={"name": "second"})).status_code == 201
    refused = await account.client.post("/v1/api-keys/", json={"name": "third"})
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"
    # Deleting one makes room again.
    keys = (await account.client.get("/v1/api-keys/")).json()
    second = next(k for k in keys if k["name"] == "second")
    assert (await account.client.delete(f"/v1/api-keys/{second['id']}")).status_code == 204
    assert (await account.client.post("/v1/api-keys/", json={"name": "third"})).status_code == 201


async def test_keys_created_at_once_never_pass_the_plan_cap(service: Service) -> None:
    """Requests racing for the last key the plan allows: one gets it (on PostgreSQL each
    node's two writers, and other nodes, count under the workspace's lock)."""
    account = await service.account("free")  # one key of two held already
    answers: list[int] = []

    async def create(n: int) -> None:
        created = await account.client.post("/v1/api-keys/", json={"name": f"racer {n}"})
        answers.append(created.status_code)

    async with trio.open_nursery() as nursery:
        for n in range(8):
            nursery.start_soon(create, n)
    assert sorted(answers) == [201] + [403] * 7
    listed = (await account.client.get("/v1/api-keys/")).json()
    assert len([k for k in listed if k["is_active"]]) == 2


async def test_starter_plan_allows_five_keys(service: Service) -> None:
    account = await service.account("starter")
    statuses = [
        (await account.client.post("/v1/api-keys/", json={"name": f"k{i}"})).status_code
        for i in range(5)
    ]
    assert statuses == [201, 201, 201, 201, 403]


async def test_deleted_key_gets_401_and_leaves_the_list(service: Service) -> None:
    account = await service.account("starter")
    created = (await account.client.post("/v1/api-keys/", json={"name": "doomed"})).json()
    doomed = service.client(headers={"Authorization": f"Bearer {created['key']}"})
    assert (await doomed.get("/v1/api-keys/")).status_code == 200

    deleted = await account.client.delete(f"/v1/api-keys/{created['id']}")
    assert deleted.status_code == 204
    assert deleted.content == b""

    refused = await doomed.get("/v1/api-keys/")
    assert refused.status_code == 401
    assert refused.json()["code"] == "unauthorized"
    ids = [k["id"] for k in (await account.client.get("/v1/api-keys/")).json()]
    assert created["id"] not in ids
    assert (await account.client.delete(f"/v1/api-keys/{created['id']}")).status_code == 404


async def test_deleted_key_stays_refused_after_the_cache_window(
    service: Service, clock: MockClock
) -> None:
    account = await service.account("starter")
    created = (await account.client.post("/v1/api-keys/", json={"name": "doomed"})).json()
    doomed = service.client(headers={"Authorization": f"Bearer {created['key']}"})
    await account.client.delete(f"/v1/api-keys/{created['id']}")
    service.clock.jump(60)
    assert (await doomed.get("/v1/api-keys/")).status_code == 401


async def test_missing_malformed_and_unknown_credentials_get_401(service: Service) -> None:
    anonymous = service.client()
    for headers in (
        {},
        {"Authorization": "Bearer"},
        {"Authorization": "Basic dXNlcjpwYXNz"},
        {"Authorization": "Bearer svc_k_not-a-real-key"},
        {"Authorization": "Bearer something-else"},
        {"Authorization": "Bearer " + "svc_k_" + "x" * 5000},
    ):
        response = await anonymous.get("/v1/api-keys/", headers=headers)
        assert response.status_code == 401, headers
        assert response.json()["code"] == "unauthorized"
        assert response.headers["WWW-Authenticate"].startswith("Bearer")


async def test_another_workspaces_key_is_404(service: Service) -> None:
    alice = await service.account("starter")
    bob = await service.account("starter")
    bobs_key = (await bob.client.post("/v1/api-keys/", json={"name": "bob"})).json()
    response = await alice.client.delete(f"/v1/api-keys/{bobs_key['id']}")
    assert response.status_code == 404
    assert response.json()["code"] == "not_found"
    assert bobs_key["id"] not in [k["id"] for k in (await alice.client.get("/v1/api-keys/")).json()]
    assert bobs_key["id"] in [k["id"] for k in (await bob.client.get("/v1/api-keys/")).json()]


async def test_unknown_and_malformed_key_ids_are_404(service: Service) -> None:
    account = await service.account()
    for key_id in ("00000000-0000-0000-0000-000000000000", "not-a-uuid", "%00", "x" * 300):
        response = await account.client.delete(f"/v1/api-keys/{key_id}")
        assert response.status_code == 404, key_id


async def test_create_validates_the_body(service: Service) -> None:
    account = await service.account()
    for body in (
        {},
        {"name": ""},
        {"name": 5},
        {"name": "x" * 201},
        {"name": "a", "permissions": ["admin"]},
    ):
        response = await account.client.post("/v1/api-keys/", json=body)
        assert response.status_code == 422, body
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"]


async def test_key_creation_is_logged_with_its_actor(service: Service) -> None:
    account = await service.account()
    created = (await account.client.post("/v1/api-keys/", json={"name": "logged"})).json()
    await account.client.delete(f"/v1/api-keys/{created['id']}")
    items = (await account.client.get("/v1/audit-log", params={"category": "security"})).json()[
        "items"
    ]
    actions = [(i["action"], i["target_id"]) for i in items]
    assert ("api_key.deleted", created["id"]) in actions
    assert ("api_key.created", created["id"]) in actions
    entry = next(
        i for i in items if i["action"] == "api_key.created" and i["target_id"] == created["id"]
    )
    assert entry["actor"] == account.email
    assert entry["target_type"] == "API key"
    assert entry["target_name"] == "logged"
    assert entry["meta"] == {"key_prefix": created["key_prefix"]}
