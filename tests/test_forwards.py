"""Forwarding rules over the API: every status code of the spec's Forwards rows, pause and
resume, the activity log, and the logs/count/stats endpoints' query limits."""

from __future__ import annotations

from typing import Any

from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import DOMAIN, SOURCE, forwarding_account, rule, verified_domain
from tests.harness.service import SMTP_HOST, Service

FORWARD_FIELDS = {
    "id",
    "source_email",
    "destination_emails",
    "destination_urls",
    "domain_id",
    "is_active",
    "last_delivered_at",
    "delivery_count",
    "created_at",
}


async def test_create_list_pause_resume_update_and_delete(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    response = await account.client.post(
        "/v1/forwards/",
        json=rule(
            domain,
            source_email="Support@IN.example.org",
            destination_urls=[https_receiver.url + "/inbound"],
        ),
    )
    assert response.status_code == 201, response.text
    forward = response.json()
    assert set(forward) == FORWARD_FIELDS
    assert forward["source_email"] == SOURCE
    assert forward["destination_emails"] == ["me@elsewhere.example"]
    assert forward["destination_urls"] == [https_receiver.url + "/inbound"]
    assert forward["domain_id"] == domain["id"]
    assert forward["is_active"] is True
    assert forward["delivery_count"] == 0
    assert forward["last_delivered_at"] is None
    assert forward["created_at"].endswith("Z")

    listed = (await account.client.get("/v1/forwards/")).json()
    assert [f["id"] for f in listed] == [forward["id"]]

    path = f"/v1/forwards/{forward['id']}"
    paused = await account.client.patch(path, json={"is_active": False})
    assert paused.status_code == 200
    assert paused.json()["is_active"] is False
    assert paused.json()["destination_emails"] == ["me@elsewhere.example"]  # unchanged
    resumed = await account.client.patch(path, json={"is_active": True, "destination_urls": None})
    assert resumed.json()["is_active"] is True
    assert resumed.json()["destination_urls"] == [https_receiver.url + "/inbound"]
    changed = await account.client.patch(path, json={"destination_emails": []})
    assert changed.status_code == 200
    assert changed.json()["destination_emails"] == []

    assert (await account.client.delete(path)).status_code == 204
    assert (await account.client.get("/v1/forwards/")).json() == []
    assert (await account.client.delete(path)).status_code == 404
    assert (await account.client.patch(path, json={"is_active": True})).status_code == 404

    items = (await account.client.get("/v1/audit-log", params={"category": "Domain"})).json()
    actions = [i["action"] for i in items["items"] if i["action"].startswith("forward.")]
    assert actions == ["forward.deleted"] + ["forward.updated"] * 3 + ["forward.created"]


async def test_create_refusals_have_the_spec_status_codes(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    post = account.client.post

    async def refused(body: dict[str, Any], status: int, code: str | None = None) -> None:
        response = await post("/v1/forwards/", json=body)
        assert response.status_code == status, (body, response.text)
        if code is not None:
            assert response.json()["code"] == code

    # 400: missing required fields, bad address syntax, no destination at all.
    await refused({"domain_id": domain["id"], "destination_emails": ["a@b.example"]}, 400)
    await refused({"source_email": SOURCE, "destination_emails": ["a@b.example"]}, 400)
    await refused(rule(domain, source_email="not an address"), 400, "invalid_email")
    await refused(rule(domain, destination_emails=["nope"]), 400, "invalid_email")
    await refused(rule(domain, destination_emails=[]), 400, "no_destinations")
    await refused(rule(domain, destination_emails=None, destination_urls=None), 400)
    # 422: wrong types, plain-HTTP URL, source off the domain, mail to itself.
    await refused(rule(domain, destination_emails="a@b.example"), 422, "validation_error")
    await refused(rule(domain, destination_urls=["http://hooks.example/in"]), 422)
    await refused(rule(domain, source_email="support@other.example"), 422)
    await refused(rule(domain, destination_emails=[SOURCE]), 422)
    # 404: unknown domain (or not an id at all); 403: another workspace's domain.
    await refused(rule(domain, domain_id="2b0f2a44-8f4b-4a5e-9a0c-7d1c7a1e0c11"), 404)
    await refused(rule(domain, domain_id="nonsense"), 404)
    other = await service.account("starter")
    theirs = await verified_domain(other, dns_server, "theirs.example.org")
    await refused(
        rule(domain, domain_id=theirs["id"], source_email="a@theirs.example.org"),
        403,
        "domain_not_owned",
    )

    assert (await post("/v1/forwards/", json=rule(domain))).status_code == 201
    # 409: one rule per source address.
    await refused(rule(domain, destination_emails=["x@y.example"]), 409, "forward_exists")
    assert len((await account.client.get("/v1/forwards/")).json()) == 1


async def test_domain_must_be_verified_and_receive_mail_here(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account("starter")
    pending: dict[str, Any] = (
        await account.client.post("/v1/domains/", json={"name": "pending.example.org"})
    ).json()
    response = await account.client.post(
        "/v1/forwards/", json=rule(pending, source_email="a@pending.example.org")
    )
    assert response.status_code == 422
    assert response.json()["code"] == "domain_not_verified"

    no_mx = await verified_domain(account, dns_server, "nomx.example.org", mx=False)
    body = rule(no_mx, source_email="a@nomx.example.org")
    response = await account.client.post("/v1/forwards/", json=body)
    assert response.status_code == 422
    assert response.json()["code"] == "mx_not_configured"
    dns_server.set("nomx.example.org", "MX", ["10 mx.somewhere-else.example."])
    assert (await account.client.post("/v1/forwards/", json=body)).status_code == 422
    dns_server.set("nomx.example.org", "MX", ["5 backup.example.", f"10 {SMTP_HOST.upper()}."])
    assert (await account.client.post("/v1/forwards/", json=body)).status_code == 201


async def test_plan_gates(service: Service, dns_server: DnsServer) -> None:
    free, free_domain = await forwarding_account(service, dns_server, "free", "free.example.org")
    body = rule(free_domain, source_email="a@free.example.org")
    response = await free.client.post("/v1/forwards/", json=body)
    assert response.status_code == 403
    assert response.json()["code"] == "plan_feature"

    starter, domain = await forwarding_account(service, dns_server, "starter")
    for n in range(5):
        created = await starter.client.post(
            "/v1/forwards/", json=rule(domain, source_email=f"box{n}@{DOMAIN}")
        )
        assert created.status_code == 201
    response = await starter.client.post("/v1/forwards/", json=rule(domain))
    assert response.status_code == 403
    assert response.json()["code"] == "plan_limit"


async def test_update_that_empties_both_lists_is_400(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    forward = (await account.client.post("/v1/forwards/", json=rule(domain))).json()
    path = f"/v1/forwards/{forward['id']}"
    response = await account.client.patch(path, json={"destination_emails": []})
    assert response.status_code == 400
    assert response.json()["code"] == "no_destinations"
    assert (
        await account.client.patch(path, json={"destination_urls": ["ftp://x"]})
    ).status_code == 422
    assert (
        await account.client.patch(path, json={"destination_emails": ["bad"]})
    ).status_code == 400
    # Nothing changed.
    [kept] = (await account.client.get("/v1/forwards/")).json()
    assert kept["destination_emails"] == ["me@elsewhere.example"]


async def test_another_workspaces_forward_is_404(service: Service, dns_server: DnsServer) -> None:
    account, domain = await forwarding_account(service, dns_server)
    forward = (await account.client.post("/v1/forwards/", json=rule(domain))).json()
    stranger = await service.account("starter")
    path = f"/v1/forwards/{forward['id']}"
    assert (await stranger.client.patch(path, json={"is_active": False})).status_code == 404
    assert (await stranger.client.delete(path)).status_code == 404
    assert (await stranger.client.get("/v1/forwards/")).json() == []
    assert (await account.client.get("/v1/forwards/")).json()[0]["is_active"] is True


async def test_logs_count_and_stats_start_empty_and_check_their_queries(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    forward = (await account.client.post("/v1/forwards/", json=rule(domain))).json()
    get = account.client.get
    assert (await get("/v1/forwards/logs")).json() == []
    assert (await get("/v1/forwards/logs/count")).json() == {"count": 0}
    assert (await get("/v1/forwards/stats")).json() == {
        "total_this_month": 0,
        "per_rule": {forward["id"]: 0},
    }
    for params in ({"limit": 0}, {"limit": 101}, {"page": -1}, {"forward_id": "x"}):
        response = await get("/v1/forwards/logs", params=params)
        assert response.status_code == 422, params
        assert response.json()["code"] == "validation_error"
    assert (await get("/v1/forwards/logs", params={"limit": 100})).status_code == 200
    assert (await get("/v1/forwards/logs/count", params={"forward_id": "x"})).status_code == 422
    # Unauthenticated: 401 everywhere.
    anonymous = service.client()
    for path in (
        "/v1/forwards/",
        "/v1/forwards/logs",
        "/v1/forwards/logs/count",
        "/v1/forwards/stats",
    ):
        assert (await anonymous.get(path)).status_code == 401
