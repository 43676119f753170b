"""The live compliance report of a domain (issue 31, section 3) through the running service:
its DNS on the loopback DNS server, its mail delivered to the SMTP sink (over STARTTLS, then
in plain text once the sink stops offering it), a complaint received by the inbound MX as an
ARF report; each provider's requirements with their status, evidence and action."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio

from engine.domains import provider_rules
from tests.harness import service as harness
from tests.harness.bounce_domain import feedback_report
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import poll, send_inbound
from tests.harness.sending import (
    SENDING_DOMAIN,
    message,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import SMTP_HOST, Account, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

BOUNCES = f"bounces.{SENDING_DOMAIN}"
PTR_NAME = "1.0.0.127.in-addr.arpa"
CUSTOMERS = "customers.example"
PLAIN = "plain.example"  # reached once the sink no longer offers STARTTLS


@pytest.fixture
async def https_service(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
) -> AsyncIterator[Service]:
    """The service with an https public URL, so unsubscribe links meet the rules."""
    settings = harness.test_settings(
        database_url,
        dns_server,
        delivery_port=str(smtp_sink.port),
        public_url="https://postroom.test",
        extra_ca_file=str(tls_ca.ca_file),
    )
    async with harness.started(nursery, settings, clock) as service:
        yield service


def publish_everything(dns_server: DnsServer) -> None:
    """What an owner and the operator publish for the sending domain to meet every rule."""
    dns_server.set(SMTP_HOST, "A", ["127.0.0.1"])
    dns_server.set(PTR_NAME, "PTR", [f"{SMTP_HOST}."])
    dns_server.set(SENDING_DOMAIN, "TXT", [f"v=spf1 a:{SMTP_HOST} ~all"])
    dns_server.set(
        f"_dmarc.{SENDING_DOMAIN}", "TXT", [f"v=DMARC1; p=none; rua=mailto:dmarc@{BOUNCES}"]
    )
    dns_server.set(BOUNCES, "MX", [f"10 {SMTP_HOST}."])
    dns_server.set(BOUNCES, "TXT", [f"v=spf1 a:{SMTP_HOST} ~all"])


async def report(account: Account, domain_id: str) -> dict[str, Any]:
    found = await account.client.get(f"/v1/domains/{domain_id}/compliance")
    assert found.status_code == 200, found.text
    body: dict[str, Any] = found.json()
    return body


def items(body: dict[str, Any], provider: str) -> dict[str, dict[str, Any]]:
    [found] = [p for p in body["providers"] if p["provider"] == provider]
    return {i["requirement"]: i for i in found["items"]}


def statuses(body: dict[str, Any]) -> dict[str, str]:
    return {p["provider"]: p["status"] for p in body["providers"]}


async def deliver(account: Account, recipients: list[str]) -> dict[str, Any]:
    sent = await account.client.post("/v1/emails/", json=message(recipients))
    assert sent.status_code == 202, sent.text
    email = await wait_for_status(account, sent.json()["id"], ("delivered",))
    return (await account.client.get(f"/v1/emails/{email['id']}")).json()  # type: ignore[no-any-return]


async def test_a_domain_that_publishes_everything_passes_then_tls_and_complaints_count(
    https_service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    service = https_service
    account = await ready_account(service, dns_server)
    [domain] = (await account.client.get("/v1/domains/")).json()
    publish_everything(dns_server)
    patched = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"bounce_domain": BOUNCES}
    )
    assert patched.status_code == 200, patched.text
    route_mail(dns_server, CUSTOMERS)
    route_mail(dns_server, PLAIN)
    # One recipient in the first: a feedback report, which names no complainant, then names
    # that one (engine/forwarding/feedback.py).
    first = await deliver(account, [f"ann@{CUSTOMERS}"])
    await deliver(account, [f"bob@{CUSTOMERS}", f"cat@{CUSTOMERS}", f"dan@{CUSTOMERS}"])

    passing = await report(account, domain["id"])
    assert (passing["domain"], passing["live"]) == (SENDING_DOMAIN, True)
    assert statuses(passing) == {"gmail": "pass", "yahoo": "pass", "microsoft": "pass"}
    assert passing["status"] == "pass"
    gmail = items(passing, "gmail")
    assert set(gmail) == {
        "spf",
        "dkim",
        "dmarc",
        "bounce_domain",
        "unsubscribe_https",
        "tls",
        "ptr",
        "complaint_rate",
    }
    # Microsoft's May 2025 rules ask nothing of TLS, reverse DNS or a complaint rate.
    assert set(items(passing, "microsoft")) == {
        "spf",
        "dkim",
        "dmarc",
        "bounce_domain",
        "unsubscribe_https",
    }
    assert all(i["action"] is None for i in gmail.values())
    assert "127.0.0.1" in gmail["spf"]["evidence"]
    assert f"d={SENDING_DOMAIN}" in gmail["dkim"]["evidence"]
    assert f"mailto:dmarc@{BOUNCES}" in gmail["dmarc"]["evidence"]
    assert gmail["tls"]["evidence"].startswith("4 of 4 deliveries")
    assert f"127.0.0.1 is {SMTP_HOST}" in gmail["ptr"]["evidence"]
    assert gmail["complaint_rate"]["evidence"].startswith("0 complaints about 4 recipients")
    assert "TLS" in gmail["tls"]["rule"] and "PTR" in gmail["ptr"]["rule"]

    # A delivery in plain text and a complaint through the MX: TLS on 4 of 5, 1 complaint
    # about 5 delivered (20%, past 0.3%); the guard's minimum volume is not reached, but
    # the providers measure the rate itself.
    smtp_sink.ssl_context = None
    plain = await deliver(account, [f"eve@{PLAIN}"])
    assert plain["events"][-1]["metadata"]["tls"] is None
    abuse = f"abuse@{SENDING_DOMAIN}"
    report_mail = feedback_report(abuse, first["message_id"])
    assert await send_inbound(service, [abuse], report_mail, sender="") == set()
    await poll(
        account,
        f"/v1/emails/{first['id']}",
        lambda e: any(x["event_type"] == "complained" for x in e["events"]),
    )
    # And the DMARC record loses its rua.
    dns_server.set(f"_dmarc.{SENDING_DOMAIN}", "TXT", ["v=DMARC1; p=quarantine"])

    later = await report(account, domain["id"])
    gmail, yahoo = items(later, "gmail"), items(later, "yahoo")
    assert gmail["tls"]["status"] == "warn"
    assert gmail["tls"]["evidence"].startswith("4 of 5 deliveries")
    assert gmail["complaint_rate"]["status"] == "fail"
    assert "1 complaints about 5 recipients delivered" in gmail["complaint_rate"]["evidence"]
    assert "20.00%" in gmail["complaint_rate"]["evidence"]
    assert yahoo["complaint_rate"]["status"] == "fail"
    assert gmail["dmarc"]["status"] == "warn"
    assert f"rua=mailto:dmarc@{BOUNCES}" in gmail["dmarc"]["action"]
    assert statuses(later) == {"gmail": "fail", "yahoo": "fail", "microsoft": "warn"}
    assert later["status"] == "fail"

    # The operator's address loses its PTR record: a fail, with what the operator does.
    dns_server.remove(PTR_NAME)
    no_ptr = items(await report(account, domain["id"]), "yahoo")["ptr"]
    assert no_ptr["status"] == "fail"
    assert "127.0.0.1 has no PTR record" in no_ptr["evidence"]
    assert "PTR record" in no_ptr["action"]


async def test_a_domain_without_spf_or_dmarc_fails_with_what_to_publish(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)  # DKIM only; the public URL is http
    dns_server.set(SMTP_HOST, "A", ["127.0.0.1"])
    [domain] = (await account.client.get("/v1/domains/")).json()

    body = await report(account, domain["id"])
    assert statuses(body) == {"gmail": "fail", "yahoo": "fail", "microsoft": "fail"}
    microsoft = items(body, "microsoft")
    assert microsoft["dkim"]["status"] == "pass"
    spf = microsoft["spf"]
    assert spf["status"] == "fail"
    assert f"{SENDING_DOMAIN} publishes no SPF record" in spf["evidence"]
    assert spf["action"] == (
        f"publish the TXT record at {SENDING_DOMAIN}: v=spf1 a:{SMTP_HOST} ~all"
    )
    dmarc = microsoft["dmarc"]
    assert dmarc["status"] == "fail"
    assert f"no DMARC record at _dmarc.{SENDING_DOMAIN}" in dmarc["evidence"]
    assert dmarc["action"].startswith(f"publish the TXT record at _dmarc.{SENDING_DOMAIN}: ")
    assert "v=DMARC1; p=none" in dmarc["action"]
    unsubscribe = items(body, "yahoo")["unsubscribe_https"]
    assert unsubscribe["status"] == "fail"
    assert microsoft["unsubscribe_https"]["status"] == "warn"  # Microsoft recommends it
    assert "POSTROOM_PUBLIC_URL" in unsubscribe["action"]
    # Microsoft only recommends what a bounce domain brings (SPF aligned too): a warning.
    assert microsoft["bounce_domain"]["status"] == "warn"
    assert microsoft["bounce_domain"]["required"] is False
    assert items(body, "gmail")["unsubscribe_https"]["required"] is True
    assert "bounce_domain" in microsoft["bounce_domain"]["action"]
    # No PTR at all for the service's address; nothing delivered yet.
    gmail = items(body, "gmail")
    assert gmail["ptr"]["status"] == "fail"
    assert gmail["tls"]["status"] == "warn"
    assert gmail["complaint_rate"]["status"] == "pass"

    # DNS that cannot answer (SERVFAIL) is not a missing record: look again later.
    dns_server.fail(f"_dmarc.{SENDING_DOMAIN}")
    unknown = items(await report(account, domain["id"]), "yahoo")["dmarc"]
    assert unknown["status"] == "warn", unknown
    assert "DNS could not answer" in unknown["evidence"]
    assert unknown["action"].startswith("check again later")


async def test_another_workspaces_domain_is_not_found(
    service: Service, dns_server: DnsServer
) -> None:
    owner = await ready_account(service, dns_server)
    [domain] = (await owner.client.get("/v1/domains/")).json()
    stranger = await service.account()
    refused = await stranger.client.get(f"/v1/domains/{domain['id']}/compliance")
    assert refused.status_code == 404, refused.text
    assert refused.json()["code"] == "not_found"
    bad = await owner.client.get("/v1/domains/not-an-id/compliance")
    assert bad.status_code == 404, bad.text
    # The owner's own: the service host has no address here, so SPF and reverse DNS cannot
    # be judged; what to do is the operator's.
    unknown = items(await report(owner, domain["id"]), "gmail")
    assert unknown["spf"]["status"] == unknown["ptr"]["status"] == "warn"
    assert "POSTROOM_SENDING_ADDRESSES" in unknown["spf"]["action"]
    assert "POSTROOM_SENDING_ADDRESSES" in unknown["ptr"]["action"]

    operation = (await owner.client.get("/openapi.json")).json()["paths"][
        "/v1/domains/{domain_id}/compliance"
    ]["get"]
    assert operation["summary"].startswith("The domain against Gmail, Yahoo and Microsoft")
    assert "0.3%" in operation["description"]
    assert operation["tags"] == ["domains"]
    assert {"200", "401", "404"} <= set(operation["responses"])


def test_every_requirement_cites_known_providers_and_every_provider_has_its_rules() -> None:
    keys = {p.key for p in provider_rules.PROVIDERS}
    assert all(r.cites and set(r.cites) <= keys for r in provider_rules.REQUIREMENTS)
    for provider in keys:
        assert {"spf", "dkim", "dmarc"} <= {
            r.key for r in provider_rules.REQUIREMENTS if provider in r.cites
        }
