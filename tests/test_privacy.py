"""`POST /v1/privacy/erase`: one address leaves a workspace's contacts, emails, events,
webhook deliveries and activity log, and stays suppressed by its hash; on both engines."""

from __future__ import annotations

import trio

from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.test_sending import message, ready_account, route_mail, wait_for_status
from tests.test_webhooks import _webhook

ANN = "ann@erase.example"


async def test_erasure_rewrites_the_address_out_and_keeps_it_suppressed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, https_receiver: HttpsReceiver
) -> None:
    account = await ready_account(service, dns_server)
    client = account.client
    route_mail(dns_server, "erase.example")
    hook = await _webhook(account, https_receiver, ["email.delivered"])
    people = (await client.post("/v1/contacts/", json={"name": "People"})).json()
    for address in (ANN, "bob@erase.example"):
        added = await client.post(f"/v1/contacts/{people['id']}/contacts", json={"email": address})
        assert added.status_code == 201, added.text
    body = message([ANN, "bob@erase.example"], text=f"Hello {ANN}, your order is ready.")
    sent = (await client.post("/v1/emails/", json=body)).json()
    await wait_for_status(account, sent["id"])
    await https_receiver.wait_for_requests(2)
    await trio.sleep(0.3)  # the deliveries' outcomes are recorded
    await client.post("/v1/suppressions/", json={"email": ANN})

    erased = await client.post("/v1/privacy/erase", json={"email": ANN.upper()})
    assert erased.status_code == 200, erased.text
    touched = erased.json()
    assert touched["contacts"] == 1 and touched["emails"] == 1
    assert touched["events"] >= 2 and touched["webhook_deliveries"] == 1
    assert touched["activity_entries"] >= 1  # suppression.created named the address
    assert touched["suppression_hash"].startswith("sha256:")

    email = await client.get(f"/v1/emails/{sent['id']}")
    assert ANN not in email.text and "bob@erase.example" in email.text
    assert "erased.invalid" in email.text  # the row keeps its shape, with a placeholder
    contacts = await client.get(f"/v1/contacts/{people['id']}")
    assert ANN not in contacts.text and "bob@erase.example" in contacts.text
    assert contacts.json()["contact_count"] == 1
    deliveries = (await client.get(f"/v1/webhooks/{hook['id']}/deliveries")).json()["items"]
    for item in deliveries:
        detail = await client.get(f"/v1/webhook-deliveries/{item['id']}")
        assert ANN not in detail.text
    log = await client.get("/v1/audit-log")
    assert ANN not in log.text and "privacy.erased" in log.text
    suppressions = await client.get("/v1/suppressions/")
    assert ANN not in suppressions.text and touched["suppression_hash"] in suppressions.text

    again = await client.post("/v1/emails/", json=message(ANN))
    assert again.json()["status"] == "rejected"  # still suppressed, known by its hash only
    assert "suppressed" in again.json()["rejection_reason"]


async def test_erasure_is_scoped_to_the_workspace(service: Service, dns_server: DnsServer) -> None:
    mine = await service.account()
    theirs = await service.account()
    for account in (mine, theirs):
        listed = (await account.client.post("/v1/contacts/", json={"name": "L"})).json()
        await account.client.post(f"/v1/contacts/{listed['id']}/contacts", json={"email": ANN})
    touched = (await mine.client.post("/v1/privacy/erase", json={"email": ANN})).json()
    assert touched["contacts"] == 1
    [their_list] = (await theirs.client.get("/v1/contacts/")).json()
    assert (await theirs.client.get(f"/v1/contacts/{their_list['id']}")).json()[
        "contact_count"
    ] == 1
    assert ANN not in (await theirs.client.get("/v1/suppressions/")).text
    refused = await mine.client.post("/v1/privacy/erase", json={"email": "not an address"})
    assert refused.status_code == 422 and refused.json()["code"] == "validation_error"
