"""BIMI: plan gate, logo rules, DMARC-driven guidance and enabling, the public logo."""

from __future__ import annotations

from typing import Any

from tests.harness.bimi import LOGO
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDING_DOMAIN, ready_account
from tests.harness.service import Account, Service


async def _domain_id(account: Account) -> str:
    domains = (await account.client.get("/v1/domains/")).json()
    domain_id: str = domains[0]["id"]
    return domain_id


async def _upload(account: Account, domain_id: str, name: str, content: bytes) -> Any:
    return await account.client.post(
        f"/v1/domains/{domain_id}/bimi/logo", files={"file": (name, content, "image/svg+xml")}
    )


async def test_status_upload_enable_and_public_logo(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server, plan="pro")
    domain_id = await _domain_id(account)
    dns_server.set(f"_dmarc.{SENDING_DOMAIN}", "TXT", ["v=DMARC1; p=none"])
    before = (await account.client.get(f"/v1/domains/{domain_id}/bimi/status")).json()
    assert before["domain"] == SENDING_DOMAIN and before["domain_verified"] is True
    assert before["bimi_svg_url"] is None and before["bimi_enabled"] is False
    assert before["bimi_dns_host"] == f"default._bimi.{SENDING_DOMAIN}"
    assert before["bimi_dns_record"].startswith("v=BIMI1; l=")
    assert "p=quarantine" in before["dmarc_upgrade_record"]
    assert (
        await account.client.post(f"/v1/domains/{domain_id}/bimi/enable")
    ).status_code == 400  # no logo

    uploaded = await _upload(account, domain_id, "logo.svg", LOGO)
    assert uploaded.status_code == 200
    body = uploaded.json()
    assert body["size"] == len(LOGO) and body["url"].endswith(f"/v1/bimi/{domain_id}/logo.svg")
    assert body["bimi_dns_host"] == f"default._bimi.{SENDING_DOMAIN}"
    refused = await account.client.post(f"/v1/domains/{domain_id}/bimi/enable")
    assert refused.status_code == 400 and refused.json()["code"] == "dmarc_policy"

    dns_server.set(
        f"_dmarc.{SENDING_DOMAIN}", "TXT", ["v=DMARC1; p=reject; rua=mailto:d@x.example"]
    )
    enabled = await account.client.post(f"/v1/domains/{domain_id}/bimi/enable")
    assert enabled.status_code == 200
    assert enabled.json()["bimi_dns_record"] == body["bimi_dns_record"]
    after = (await account.client.get(f"/v1/domains/{domain_id}/bimi/status")).json()
    assert after["bimi_enabled"] is True and after["dmarc_upgrade_record"] is None
    assert after["bimi_svg_url"] == body["url"]

    logo = await service.client().get(f"/v1/bimi/{domain_id}/logo.svg")  # no authentication
    assert logo.status_code == 200 and logo.content == LOGO
    assert logo.headers["content-type"] == "image/svg+xml"
    assert logo.headers["cache-control"] == "public, max-age=86400"
    assert logo.headers["access-control-allow-origin"] == "*"
    log = (await account.client.get("/v1/audit-log", params={"category": "domain"})).json()
    assert {"bimi.logo_uploaded", "bimi.enabled"} <= {i["action"] for i in log["items"]}


async def test_logo_rules(service: Service, dns_server: DnsServer) -> None:
    account = await ready_account(service, dns_server, plan="business")
    domain_id = await _domain_id(account)
    cases = [
        ("logo.png", LOGO, "not_svg"),
        ("logo.svg", b"<html>not an svg</html>", "not_svg"),
        ("logo.svg", b"\xff\xfe<\x00s\x00v\x00g\x00/\x00>\x00", "not_svg"),  # UTF-16
        ("logo.svg", LOGO[:-6] + b"<!--" + b"x" * (100 * 1024) + b"--></svg>", "logo_too_large"),
        (
            "logo.svg",
            b'<svg xmlns="http://www.w3.org/2000/svg"><script>alert(1)</script></svg>',
            "unsafe_svg",
        ),
        (
            "logo.svg",
            b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"></svg>',
            "unsafe_svg",
        ),
        (
            "logo.svg",
            b'<svg xmlns="http://www.w3.org/2000/svg"><a href="javascript:alert(1)"/></svg>',
            "unsafe_svg",
        ),
    ]
    for name, content, code in cases:
        response = await _upload(account, domain_id, name, content)
        assert response.status_code == 400, (name, content[:40])
        assert response.json()["code"] == code, (name, content[:40])
    missing = await account.client.post(
        f"/v1/domains/{domain_id}/bimi/logo", files={"other": ("a.svg", LOGO)}
    )
    assert missing.status_code == 400
    assert (await service.client().get(f"/v1/bimi/{domain_id}/logo.svg")).status_code == 404
    assert (
        await service.client().get("/v1/bimi/00000000-0000-0000-0000-000000000000/logo.svg")
    ).status_code == 404


async def test_bimi_needs_pro_and_a_verified_domain(
    service: Service, dns_server: DnsServer
) -> None:
    starter = await ready_account(service, dns_server, plan="starter")
    domain_id = await _domain_id(starter)
    for method, path in (("GET", "status"), ("POST", "enable")):
        response = await starter.client.request(method, f"/v1/domains/{domain_id}/bimi/{path}")
        assert response.status_code == 403 and response.json()["code"] == "plan_feature"
    assert (await _upload(starter, domain_id, "logo.svg", LOGO)).status_code == 403

    pro = await service.account("pro")
    pending = (await pro.client.post("/v1/domains/", json={"name": "pending.example"})).json()
    await _upload(pro, pending["id"], "logo.svg", LOGO)
    dns_server.set("_dmarc.pending.example", "TXT", ["v=DMARC1; p=reject"])
    refused = await pro.client.post(f"/v1/domains/{pending['id']}/bimi/enable")
    assert refused.status_code == 400 and refused.json()["code"] == "domain_not_verified"
    assert (
        await pro.client.get(f"/v1/domains/{domain_id}/bimi/status")
    ).status_code == 404  # not theirs
