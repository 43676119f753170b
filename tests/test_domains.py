"""Sending domains: registration, the DNS records to publish, verification through real DNS,
tracking settings, deletion, workspace isolation and the activity log."""

from __future__ import annotations

import base64
from typing import Any

import httpx
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import rsa

from tests.harness.dns_server import DnsServer
from tests.harness.domains import create_domain, publish, record, verify
from tests.harness.service import SMTP_HOST, Account, Service

UNKNOWN_ID = "00000000-0000-0000-0000-000000000000"
DOMAIN_FIELDS = {
    "id",
    "name",
    "status",
    "dns_records",
    "open_tracking",
    "click_tracking",
    "ed25519_signing",
    "tags_header",
    "bounce_domain",
    "tracking_host",
    "marketing_stopped_at",
    "created_at",
    "verified_at",
    "compliance",
}


def statuses(domain: dict[str, Any]) -> dict[str, str]:
    return {r["purpose"]: r["status"] for r in domain["dns_records"]}


def other_dkim_value() -> str:
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return "v=DKIM1; k=rsa; p=" + base64.b64encode(der).decode()


async def domain_log(account: Account) -> list[dict[str, Any]]:
    response = await account.client.get("/v1/audit-log", params={"category": "domain"})
    assert response.status_code == 200
    items: list[dict[str, Any]] = response.json()["items"]
    return items


async def test_create_returns_the_domain_with_the_records_to_publish(service: Service) -> None:
    account = await service.account()
    response = await account.client.post("/v1/domains/", json={"name": "example.com"})
    assert response.status_code == 201
    domain = response.json()
    assert set(domain) == DOMAIN_FIELDS
    assert domain["name"] == "example.com"
    assert domain["status"] == "pending"
    assert domain["verified_at"] is None
    assert domain["marketing_stopped_at"] is None
    assert domain["open_tracking"] is False
    assert domain["click_tracking"] is False
    assert domain["bounce_domain"] is None  # none set: no bounce records
    assert domain["created_at"].endswith("Z")
    for entry in domain["dns_records"]:
        assert set(entry) == {
            "type",
            "host",
            "value",
            "purpose",
            "required",
            "status",
            "detail",
            "suggested_value",
        }
        assert entry["status"] == "pending"
    assert sorted(r["purpose"] for r in domain["dns_records"]) == [
        "dkim",
        "dmarc",
        "mx",
        "spf",
        "tls_rpt",
    ]

    dkim = record(domain, "dkim")
    assert (dkim["type"], dkim["required"]) == ("TXT", True)
    assert dkim["host"].endswith("._domainkey.example.com")
    assert len(dkim["value"]) > 255  # needs several TXT character-strings
    assert dkim["value"].startswith("v=DKIM1; k=rsa; p=")
    public_key = serialization.load_der_public_key(base64.b64decode(dkim["value"].split("p=")[1]))
    assert isinstance(public_key, rsa.RSAPublicKey)
    assert public_key.key_size == 2048

    spf = record(domain, "spf")
    assert (spf["type"], spf["host"], spf["required"]) == ("TXT", "example.com", False)
    assert spf["value"].startswith("v=spf1") and SMTP_HOST in spf["value"]
    dmarc = record(domain, "dmarc")
    assert (dmarc["type"], dmarc["host"], dmarc["required"]) == ("TXT", "_dmarc.example.com", False)
    assert dmarc["value"].startswith("v=DMARC1")
    mx = record(domain, "mx")
    assert (mx["type"], mx["host"], mx["required"]) == ("MX", "example.com", False)
    assert mx["value"].split()[-1].rstrip(".") == SMTP_HOST


async def test_name_is_canonicalised_and_each_domain_gets_its_own_key(service: Service) -> None:
    account = await service.account("pro")
    mail = await create_domain(account, "Mail.EXAMPLE.com.")
    assert mail["name"] == "mail.example.com"
    assert record(mail, "dkim")["host"].endswith("._domainkey.mail.example.com")
    assert record(mail, "spf")["host"] == "mail.example.com"
    news = await create_domain(account, "  news.example.org ")
    assert news["name"] == "news.example.org"
    idn = await create_domain(account, "Bücher.example")
    assert idn["name"] == "xn--bcher-kva.example"
    assert record(idn, "dkim")["host"].endswith("._domainkey.xn--bcher-kva.example")
    # IDNA 2008, as registries use it: faß.de is its own domain, not fass.de.
    assert (await create_domain(account, "Faß.de"))["name"] == "xn--fa-hia.de"
    keys = {record(d, "dkim")["value"] for d in (mail, news, idn)}
    assert len(keys) == 3


async def test_invalid_names_are_422(service: Service) -> None:
    account = await service.account()
    for name in (
        "localhost",
        "-a.com",
        "a-.com",
        "a..com",
        "a b.com",
        "a_b.com",
        ".",
        "",
        "example.123",
        "x" * 300,
        ("a" * 64) + ".com",
        5,
        None,
    ):
        response = await account.client.post("/v1/domains/", json={"name": name})
        assert response.status_code == 422, name
        assert response.json()["code"] == "validation_error"
        assert response.json()["errors"]
    bodies: tuple[object, ...] = ({}, [], "example.com")
    for body in bodies:
        response = await account.client.post("/v1/domains/", json=body)
        assert response.status_code == 422, body
    assert (await account.client.get("/v1/domains/")).json() == []


async def test_same_name_twice_in_a_workspace_is_409(service: Service) -> None:
    account = await service.account("starter")
    await create_domain(account, "example.com")
    for name in ("example.com", "EXAMPLE.com."):
        response = await account.client.post("/v1/domains/", json={"name": name})
        assert response.status_code == 409, name
        assert response.json()["code"] == "domain_exists"
    assert len((await account.client.get("/v1/domains/")).json()) == 1


async def test_free_plan_allows_one_domain(service: Service) -> None:
    account = await service.account("free")
    first = await create_domain(account, "one.example")
    refused = await account.client.post("/v1/domains/", json={"name": "two.example"})
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"
    # Removing the first makes room again.
    assert (await account.client.delete(f"/v1/domains/{first['id']}")).status_code == 204
    await create_domain(account, "two.example")


async def test_starter_plan_allows_three_domains(service: Service) -> None:
    account = await service.account("starter")
    statuses_seen = [
        (await account.client.post("/v1/domains/", json={"name": f"d{i}.example"})).status_code
        for i in range(4)
    ]
    assert statuses_seen == [201, 201, 201, 403]


async def test_domain_is_verified_only_once_its_dkim_record_is_published(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)

    before = await verify(account, domain)
    assert before["status"] == "pending"
    assert before["verified_at"] is None
    assert statuses(before)["dkim"] == "missing"

    publish(dns_server, record(domain, "dkim"))
    after = await verify(account, domain)
    assert after["status"] == "verified"
    assert after["verified_at"] is not None and after["verified_at"].endswith("Z")
    assert statuses(after)["dkim"] == "verified"

    stored = (await account.client.get(f"/v1/domains/{domain['id']}")).json()
    assert stored == after


async def test_dkim_record_with_another_key_fails_verification(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    dkim = record(domain, "dkim")
    dns_server.set(dkim["host"], "TXT", [other_dkim_value()])

    failed = await verify(account, domain)
    assert failed["status"] == "failed"
    assert failed["verified_at"] is None
    assert statuses(failed)["dkim"] != "verified"

    # Publishing the right key fixes it.
    publish(dns_server, dkim)
    assert (await verify(account, domain))["status"] == "verified"


async def test_dns_failure_on_the_dkim_host_leaves_a_pending_domain_pending(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    dkim = record(domain, "dkim")
    publish(dns_server, dkim)
    dns_server.fail(dkim["host"])

    checked = await verify(account, domain)
    assert checked["status"] == "pending"
    assert checked["verified_at"] is None
    assert statuses(checked)["dkim"] == "pending"


async def test_verified_domain_stays_verified_since_its_first_check_even_when_dns_fails(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    dkim = record(domain, "dkim")
    publish(dns_server, dkim)
    verified = await verify(account, domain)

    again = await verify(account, domain)
    assert again["status"] == "verified"
    assert again["verified_at"] == verified["verified_at"]

    dns_server.fail(dkim["host"])
    checked = await verify(account, domain)
    assert checked["status"] == "verified"
    assert checked["verified_at"] == verified["verified_at"]


async def test_verified_domain_whose_dkim_record_disappears_fails(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    dkim = record(domain, "dkim")
    publish(dns_server, dkim)
    assert (await verify(account, domain))["status"] == "verified"

    dns_server.remove(dkim["host"])
    checked = await verify(account, domain)
    assert checked["status"] == "failed"
    assert checked["verified_at"] is None
    assert statuses(checked)["dkim"] == "missing"


async def test_spf_dmarc_and_mx_report_verified_but_do_not_verify_the_domain(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    spf, dmarc, mx = record(domain, "spf"), record(domain, "dmarc"), record(domain, "mx")
    publish(dns_server, dmarc)
    dns_server.set(SMTP_HOST, "A", ["127.0.0.1"])  # the service's address: `a:` finds it
    # Published at the same name as the MX record: set both types of the apex.
    dns_server.set(spf["host"], "TXT", ["google-site-verification=abc", spf["value"]])
    dns_server.set(mx["host"], "MX", [mx["value"]])

    checked = await verify(account, domain)
    assert statuses(checked) == {
        "dkim": "missing",
        "spf": "verified",
        "dmarc": "verified",
        "mx": "verified",
        "tls_rpt": "missing",
    }
    assert checked["status"] == "pending"


async def test_spf_and_mx_pointing_elsewhere_are_missing_and_do_not_block_verification(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    publish(dns_server, record(domain, "dkim"))
    dns_server.set(SMTP_HOST, "A", ["127.0.0.1"])
    dns_server.set("_spf.elsewhere.example", "TXT", ["v=spf1 ip4:198.51.100.0/24 -all"])
    dns_server.set("example.com", "TXT", ["v=spf1 include:_spf.elsewhere.example ~all"])
    dns_server.set("example.com", "MX", ["10 mx.elsewhere.example."])

    checked = await verify(account, domain)
    assert checked["status"] == "verified"
    assert statuses(checked) == {
        "dkim": "verified",
        "spf": "missing",
        "dmarc": "missing",
        "mx": "missing",
        "tls_rpt": "missing",
    }


async def test_a_name_verified_by_another_workspace_cannot_be_verified_until_released(
    service: Service, dns_server: DnsServer
) -> None:
    owner = await service.account()
    rival = await service.account()
    owned = await create_domain(owner, "example.com")
    publish(dns_server, record(owned, "dkim"))
    assert (await verify(owner, owned))["status"] == "verified"

    claimed = await create_domain(rival, "example.com")
    publish(dns_server, record(claimed, "dkim"))  # its own selector, so both are published
    response = await rival.client.post(f"/v1/domains/{claimed['id']}/verify")
    assert response.status_code == 409
    assert response.json()["code"] == "domain_taken"

    assert (await rival.client.get(f"/v1/domains/{claimed['id']}")).json()["status"] == ("pending")
    assert (await owner.client.get(f"/v1/domains/{owned['id']}")).json()["status"] == "verified"

    assert (await owner.client.delete(f"/v1/domains/{owned['id']}")).status_code == 204
    assert (await verify(rival, claimed))["status"] == "verified"


async def test_get_and_list_return_the_workspaces_domains(service: Service) -> None:
    account = await service.account("starter")
    first = await create_domain(account, "one.example")
    second = await create_domain(account, "two.example")

    got = await account.client.get(f"/v1/domains/{first['id']}")
    assert got.status_code == 200
    assert got.json() == first
    # Ids are accepted in any case.
    assert (await account.client.get(f"/v1/domains/{first['id'].upper()}")).json() == first

    listed = await account.client.get("/v1/domains/")
    assert listed.status_code == 200
    assert listed.json() == [first, second]


async def test_patch_changes_only_the_supplied_tracking_settings(service: Service) -> None:
    account = await service.account()
    domain = await create_domain(account)
    url = f"/v1/domains/{domain['id']}"

    async def patch(body: dict[str, Any]) -> tuple[bool, bool]:
        response = await account.client.patch(url, json=body)
        assert response.status_code == 200, response.text
        assert set(response.json()) == DOMAIN_FIELDS
        stored = (await account.client.get(url)).json()
        assert stored == response.json()
        return stored["open_tracking"], stored["click_tracking"]

    assert await patch({"open_tracking": True}) == (True, False)
    assert await patch({"click_tracking": True}) == (True, True)
    assert await patch({"open_tracking": False}) == (False, True)
    assert await patch({}) == (False, True)
    assert await patch({"click_tracking": None}) == (False, True)
    for body in ({"open_tracking": "sometimes"}, {"click_tracking": [True]}):
        refused = await account.client.patch(url, json=body)
        assert refused.status_code == 422, body
        assert refused.json()["code"] == "validation_error"
    final = (await account.client.get(url)).json()
    assert (final["name"], final["status"], final["dns_records"]) == (
        domain["name"],
        domain["status"],
        domain["dns_records"],
    )


async def test_deleted_domain_is_gone(service: Service) -> None:
    account = await service.account()
    domain = await create_domain(account)
    url = f"/v1/domains/{domain['id']}"

    deleted = await account.client.delete(url)
    assert deleted.status_code == 204
    assert deleted.content == b""

    assert (await account.client.get("/v1/domains/")).json() == []
    for response in (
        await account.client.get(url),
        await account.client.delete(url),
        await account.client.patch(url, json={"open_tracking": True}),
        await account.client.post(f"{url}/verify"),
    ):
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    # The name can be registered again, with a new key.
    again = await create_domain(account, domain["name"])
    assert record(again, "dkim")["value"] != record(domain, "dkim")["value"]


async def test_another_workspaces_domain_is_404(service: Service, dns_server: DnsServer) -> None:
    owner = await service.account()
    stranger = await service.account()
    domain = await create_domain(owner)
    publish(dns_server, record(domain, "dkim"))  # verifying would succeed for the owner
    url = f"/v1/domains/{domain['id']}"

    for response in (
        await stranger.client.get(url),
        await stranger.client.patch(url, json={"open_tracking": True}),
        await stranger.client.post(f"{url}/verify"),
        await stranger.client.delete(url),
    ):
        assert response.status_code == 404
        assert response.json()["code"] == "not_found"
    assert (await stranger.client.get("/v1/domains/")).json() == []

    untouched = (await owner.client.get(url)).json()
    assert untouched == domain
    assert [e["action"] for e in await domain_log(owner)] == ["domain.created"]


async def test_unknown_and_malformed_domain_ids_are_404(service: Service) -> None:
    account = await service.account()
    client: httpx.AsyncClient = account.client
    for domain_id in (UNKNOWN_ID, "not-a-uuid", "%00", "x" * 300):
        url = f"/v1/domains/{domain_id}"
        for response in (
            await client.get(url),
            await client.patch(url, json={"open_tracking": True}),
            await client.post(f"{url}/verify"),
            await client.delete(url),
        ):
            assert response.status_code == 404, (domain_id, response.request.method)
            assert response.json()["code"] == "not_found"


async def test_domain_changes_are_in_the_activity_log(
    service: Service, dns_server: DnsServer
) -> None:
    account = await service.account()
    domain = await create_domain(account)
    await verify(account, domain)  # nothing published yet
    publish(dns_server, record(domain, "dkim"))
    await verify(account, domain)
    await account.client.patch(f"/v1/domains/{domain['id']}", json={"click_tracking": True})
    await account.client.delete(f"/v1/domains/{domain['id']}")

    entries = await domain_log(account)
    assert [e["action"] for e in entries] == [
        "domain.deleted",
        "domain.updated",
        "domain.verified",
        "domain.verification_failed",
        "domain.created",
    ]
    for entry in entries:
        assert entry["category"] == "Domain"
        assert entry["target_type"] == "Domain"
        assert entry["target_name"] == "example.com"
        assert entry["target_id"] == domain["id"]
        assert entry["actor"] == account.email
    # They are not filed under another category.
    security = await account.client.get("/v1/audit-log", params={"category": "Security"})
    assert not [e for e in security.json()["items"] if e["action"].startswith("domain.")]
