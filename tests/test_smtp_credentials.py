"""SMTP credentials: create one per verified domain, the plan cap, list, deactivate, log."""

from __future__ import annotations

import pytest
import trio

from engine.accounts import users as accounts
from postroom import config
from postroom.service import RunningService, serve
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.domains import add_domain
from tests.harness.service import SMTP_HOST, Service


async def test_created_credential_shows_its_password_once(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account("starter")
    domain = await add_domain(account, dns_server, "relay.example.org")
    created = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    assert created.status_code == 201
    body = created.json()
    assert set(body) == {"id", "username", "password", "smtp_host", "smtp_port", "created_at"}
    assert body["username"] == f"{account.workspace_id[:8]}@relay.example.org"
    assert body["smtp_host"] == SMTP_HOST
    assert body["smtp_port"] == 587
    assert len(body["password"]) >= 24
    assert body["created_at"].endswith("Z")

    listed = await account.client.get("/v1/smtp-credentials/")
    assert listed.status_code == 200
    assert listed.json() == [
        {
            "id": body["id"],
            "username": body["username"],
            "domain_id": domain["id"],
            "is_active": True,
            "created_at": body["created_at"],
        }
    ]
    assert body["password"] not in listed.text


async def test_the_credential_names_the_relays_configured_host_and_port(
    nursery: trio.Nursery, database_url: str, dns_server: DnsServer, clock: trio.testing.MockClock
) -> None:
    settings = harness.test_settings(
        database_url, dns_server, smtp_host="relay.postroom.example", smtp_port="2625"
    )
    running: RunningService = await nursery.start(serve, settings)
    service = Service(running, clock)
    try:
        account = await service.account("starter")
        domain = await add_domain(account, dns_server, "relay.example.org")
        created = await account.client.post(
            "/v1/smtp-credentials/", json={"domain_id": domain["id"]}
        )
        assert created.status_code == 201
        assert (created.json()["smtp_host"], created.json()["smtp_port"]) == (
            "relay.postroom.example",
            2625,
        )
    finally:
        await service.aclose()
        running.stop()


def test_the_relays_port_is_the_submission_listeners_unless_set() -> None:
    environ = {"POSTROOM_SUBMISSION_LISTEN": "0.0.0.0:2587"}
    assert config.load(environ).smtp_port == 2587
    assert config.load(environ | {"POSTROOM_SMTP_PORT": "587"}).smtp_port == 587
    with pytest.raises(config.SettingsError, match="POSTROOM_SMTP_PORT"):
        config.load(environ | {"POSTROOM_SMTP_PORT": "submission"})


async def test_workspaces_made_back_to_back_have_distinct_relay_username_prefixes(
    service: Service,
) -> None:
    # The relay username is the workspace id's first 8 characters and the domain name: a
    # time-ordered id would give every workspace of the same minute the same prefix.
    prefixes = {(await service.account()).workspace_id[:8] for _ in range(5)}
    assert len(prefixes) == 5


async def test_one_active_credential_per_domain(service: Service, dns_server: DnsServer) -> None:
    account = await service.account("starter")
    domain = await add_domain(account, dns_server, "relay.example.org")
    first = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    second = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    assert second.status_code == 409
    assert second.json()["code"] == "credential_exists"
    # Deleting the active one makes room for a new one; the old one stays listed.
    deleted = await account.client.delete(f"/v1/smtp-credentials/{first.json()['id']}")
    assert deleted.status_code == 204
    third = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    assert third.status_code == 201
    listed = {
        c["id"]: c["is_active"] for c in (await account.client.get("/v1/smtp-credentials/")).json()
    }
    assert listed == {first.json()["id"]: False, third.json()["id"]: True}


async def test_unverified_unknown_and_foreign_domains_are_refused(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account("starter")
    pending = await add_domain(account, dns_server, "pending.example.org", verify=False)
    refused = await account.client.post("/v1/smtp-credentials/", json={"domain_id": pending["id"]})
    assert refused.status_code == 400
    assert "not verified" in refused.json()["detail"]

    unknown = await account.client.post(
        "/v1/smtp-credentials/", json={"domain_id": "00000000-0000-4000-8000-000000000000"}
    )
    assert unknown.status_code == 404

    other = await service.account("starter")
    theirs = await add_domain(other, dns_server, "theirs.example.org")
    foreign = await account.client.post("/v1/smtp-credentials/", json={"domain_id": theirs["id"]})
    assert foreign.status_code == 404

    for body in ({}, {"domain_id": "not-a-uuid"}, {"domain_id": 7}):
        invalid = await account.client.post("/v1/smtp-credentials/", json=body)
        assert invalid.status_code == 422, body
        assert invalid.json()["code"] == "validation_error"


async def test_plan_caps_active_credentials(service: Service, dns_server: DnsServer) -> None:
    account = await service.account("starter")
    one = await add_domain(account, dns_server, "one.example.org")
    two = await add_domain(account, dns_server, "two.example.org")
    assert (
        await account.client.post("/v1/smtp-credentials/", json={"domain_id": one["id"]})
    ).status_code == 201
    # Down to Free (one credential): the second domain gets none.
    await accounts.set_plan(service.running.runtime, account.email, "free")
    refused = await account.client.post("/v1/smtp-credentials/", json={"domain_id": two["id"]})
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"


async def test_delete_deactivates_and_is_logged(service: Service, dns_server: DnsServer) -> None:
    account = await service.account("starter")
    domain = await add_domain(account, dns_server, "relay.example.org")
    created = (
        await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    ).json()
    assert (await account.client.delete(f"/v1/smtp-credentials/{created['id']}")).status_code == 204
    [item] = (await account.client.get("/v1/smtp-credentials/")).json()
    assert item["is_active"] is False

    missing = await account.client.delete(
        "/v1/smtp-credentials/00000000-0000-4000-8000-000000000000"
    )
    assert missing.status_code == 404
    other = await service.account("starter")
    assert (await other.client.delete(f"/v1/smtp-credentials/{created['id']}")).status_code == 404
    assert (await other.client.get("/v1/smtp-credentials/")).json() == []

    items = (await account.client.get("/v1/audit-log", params={"category": "security"})).json()[
        "items"
    ]
    actions = [(i["action"], i["target_id"]) for i in items]
    assert ("smtp_credential.created", created["id"]) in actions
    assert ("smtp_credential.deleted", created["id"]) in actions
    entry = next(i for i in items if i["action"] == "smtp_credential.created")
    assert entry["target_type"] == "SMTP credential"
    assert entry["target_name"] == created["username"]
    assert created["password"] not in str(items)
