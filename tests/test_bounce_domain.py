"""Bounces and complaints reach Postroom when the domain's mail is hosted elsewhere (issue 30,
section 2), on both engines, through the real service, its MX and the loopback DNS server.

A bounce domain set through the domain API is listed with its MX and SPF records, checked,
and once both are found it carries the envelope sender (SPF aligned with the From domain
under DMARC's relaxed rule, DKIM still the From domain's); DSNs sent there bounce the email.
postmaster@ and abuse@ of every served domain are accepted: a feedback report there is a
complaint against the email it names, anything else is kept for the owning workspace only.
"""

from __future__ import annotations

import re
from typing import Any

import trio
from trio.testing import MockClock

from engine.domains.checker import INTERVAL
from engine.forwarding import postmaster
from storage import postmaster_mail
from storage.codec import new_id
from storage.postmaster_mail import PostmasterMail
from tests.harness.bounce_domain import (
    BOUNCE_DOMAIN,
    feedback_report,
    letter,
    only_domain,
    postfix_dsn,
    with_bounce_domain,
)
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import poll, send_inbound
from tests.harness.sending import (
    SENDING_DOMAIN,
    dkim_verifies,
    message,
    route_mail,
    wait_for_status,
)
from tests.harness.service import SMTP_HOST, Account, Service
from tests.harness.smtp_sink import ReceivedMessage, SmtpSink

RECIPIENT = "ann@customer.example"


async def delivered_email(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> tuple[Account, dict[str, Any], dict[str, Any], ReceivedMessage]:
    """An email delivered to RECIPIENT from a domain with BOUNCE_DOMAIN in use: the account,
    the domain, the send response and what the sink received."""
    account, domain = await with_bounce_domain(service, dns_server)
    route_mail(dns_server, "customer.example")
    sent = (await account.client.post("/v1/emails/", json=message(RECIPIENT))).json()
    [received] = await smtp_sink.wait_for_messages(1)
    await wait_for_status(account, sent["id"], ("delivered",))
    return account, domain, sent, received


def bounce_records(domain: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {r["type"]: r for r in domain["dns_records"] if r["purpose"] == "bounce"}


def dkim_domain(data: bytes) -> str:
    found = re.search(rb"DKIM-Signature:[^\r\n]*(?:\r\n[ \t][^\r\n]*)*", data)
    assert found is not None
    tag = re.search(rb"\bd=([^;\s]+)", found.group(0))
    assert tag is not None
    return tag.group(1).decode()


async def test_the_bounce_domain_is_guided_checked_and_then_the_envelope_sender(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await with_bounce_domain(service, dns_server, publish=False)
    assert domain["status"] == "verified" and domain["bounce_domain"] == BOUNCE_DOMAIN
    records = bounce_records(domain)
    assert records["MX"]["host"] == BOUNCE_DOMAIN and records["MX"]["value"] == f"10 {SMTP_HOST}"
    assert records["TXT"]["host"] == BOUNCE_DOMAIN
    assert records["TXT"]["value"] == f"v=spf1 a:{SMTP_HOST} ~all"
    assert {r["status"] for r in records.values()} == {"missing"}
    assert not any(r["required"] for r in records.values())

    # Not verified yet: the envelope sender stays on the sending domain.
    route_mail(dns_server, "customer.example")
    await account.client.post("/v1/emails/", json=message(RECIPIENT))
    [before] = await smtp_sink.wait_for_messages(1)
    assert before.mail_from.endswith(f"@{SENDING_DOMAIN}")

    dns_server.set(BOUNCE_DOMAIN, "MX", [f"10 {SMTP_HOST}."])
    dns_server.set(BOUNCE_DOMAIN, "TXT", [f"v=spf1 a:{SMTP_HOST} ~all"])
    domain = (await account.client.post(f"/v1/domains/{domain['id']}/verify")).json()
    assert {r["status"] for r in bounce_records(domain).values()} == {"verified"}

    sent = (await account.client.post("/v1/emails/", json=message(RECIPIENT))).json()
    received = (await smtp_sink.wait_for_messages(2))[1]
    assert received.mail_from == f"bounces+{sent['id']}@{BOUNCE_DOMAIN}"
    # DMARC relaxed alignment: SPF's domain and DKIM's d= share the From domain's
    # organisational domain; DKIM still signs as the From domain, and verifies.
    assert received.mail_from.rpartition("@")[2].endswith("." + SENDING_DOMAIN)
    assert dkim_domain(received.data) == SENDING_DOMAIN
    assert f"From: Hello <hello@{SENDING_DOMAIN}>".encode() in received.data
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)

    # A later check that finds the MX gone puts the envelope sender back on the domain.
    dns_server.remove(BOUNCE_DOMAIN, "MX")
    domain = (await account.client.post(f"/v1/domains/{domain['id']}/verify")).json()
    assert bounce_records(domain)["MX"]["status"] == "missing"
    await account.client.post("/v1/emails/", json=message(RECIPIENT))
    assert (await smtp_sink.wait_for_messages(3))[2].mail_from.endswith(f"@{SENDING_DOMAIN}")


async def test_the_bounce_domain_field_is_validated_and_can_be_cleared(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    path = f"/v1/domains/{domain['id']}"
    for value in ("bounces.elsewhere.example", SENDING_DOMAIN, "not a domain", ""):
        refused = await account.client.patch(path, json={"bounce_domain": value})
        assert refused.status_code == 422, value
        assert refused.json()["code"] == "validation_error"
    unknown = await account.client.patch(path, json={"bounce_domian": BOUNCE_DOMAIN})
    assert unknown.status_code == 422 and "bounce_domain" in unknown.json()["detail"]
    assert (await only_domain(account))["bounce_domain"] == BOUNCE_DOMAIN

    other = await service.account("starter")
    assert (await other.client.patch(path, json={"bounce_domain": None})).status_code == 404

    # Another bounce domain starts unchecked; none leaves only the domain's own records.
    changed = await account.client.patch(path, json={"bounce_domain": f"rp.{SENDING_DOMAIN}"})
    assert {r["status"] for r in bounce_records(changed.json()).values()} == {"pending"}
    cleared = (await account.client.patch(path, json={"bounce_domain": None})).json()
    assert cleared["bounce_domain"] is None and bounce_records(cleared) == {}
    log = (await account.client.get("/v1/audit-log")).json()["items"]
    values = [e["meta"].get("bounce_domain", "-") for e in log if e["action"] == "domain.updated"]
    assert values[:3] == [None, f"rp.{SENDING_DOMAIN}", BOUNCE_DOMAIN]


async def test_a_dsn_sent_to_the_bounce_domain_bounces_the_email(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, _, sent, received = await delivered_email(service, dns_server, smtp_sink)
    assert received.mail_from.endswith(f"@{BOUNCE_DOMAIN}")
    report = postfix_dsn(
        received.mail_from, [(RECIPIENT, "5.1.1", "550 5.1.1 <ann@customer.example>: unknown")]
    )
    assert await send_inbound(service, [received.mail_from], report, sender="") == set()
    email = await wait_for_status(account, sent["id"], ("bounced",))
    [bounced] = [e for e in email["events"] if e["event_type"] == "bounced"]
    assert bounced["recipient"] == RECIPIENT and bounced["metadata"]["dsn"] == "5.1.1"
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert [(s["email"], s["reason"]) for s in listed] == [(RECIPIENT, "hard_bounce")]


async def test_postmaster_and_abuse_are_accepted_for_every_served_domain(
    service: Service, dns_server: DnsServer
) -> None:
    await with_bounce_domain(service, dns_server)
    served = [
        f"postmaster@{SENDING_DOMAIN}",
        f"Abuse@{SENDING_DOMAIN.upper()}",
        f"postmaster@{BOUNCE_DOMAIN}",
        f"abuse@{BOUNCE_DOMAIN}",
    ]
    assert await send_inbound(service, served, letter(served[0], "hi")) == set()
    unserved = ["postmaster@not-served.example", f"webmaster@{SENDING_DOMAIN}"]
    assert await send_inbound(service, unserved, letter(unserved[0], "hi")) == set(unserved)
    # A domain registered but not verified is not served.
    pending = await service.account("starter")
    await pending.client.post("/v1/domains/", json={"name": "pending.example"})
    refused = await send_inbound(service, ["abuse@pending.example"], letter("x", "hi"))
    assert refused == {"abuse@pending.example"}


async def test_a_feedback_report_to_abuse_is_a_complaint_against_the_email_it_names(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain, sent, _ = await delivered_email(service, dns_server, smtp_sink)
    # Named by the Message-ID alone: the provider quoted no Return-Path.
    report = feedback_report(f"abuse@{SENDING_DOMAIN}", sent["message_id"])
    assert await send_inbound(service, [f"abuse@{SENDING_DOMAIN}"], report, sender="") == set()
    email = await poll(
        account,
        f"/v1/emails/{sent['id']}",
        lambda e: any(x["event_type"] == "complained" for x in e["events"]),
    )
    [complained] = [e for e in email["events"] if e["event_type"] == "complained"]
    assert complained["recipient"] == RECIPIENT
    assert complained["metadata"]["feedback_type"] == "abuse"
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert [(s["email"], s["reason"], s["source_email_id"]) for s in listed] == [
        (RECIPIENT, "complaint", sent["id"])
    ]
    # Read as a complaint, so not kept as mail.
    kept = (await account.client.get(f"/v1/domains/{domain['id']}/postmaster-mail")).json()
    assert kept["total"] == 0


async def test_a_report_naming_another_workspaces_email_is_kept_not_applied(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, _, sent, received = await delivered_email(service, dns_server, smtp_sink)
    # Another workspace's verified domain gets a report naming the first one's email.
    other = await service.account("starter")
    name = "other.example"
    created = (await other.client.post("/v1/domains/", json={"name": name})).json()
    dkim_record = next(r for r in created["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim_record["host"], "TXT", [dkim_record["value"]])
    await other.client.post(f"/v1/domains/{created['id']}/verify")
    report = feedback_report(f"abuse@{name}", sent["message_id"], received.mail_from)
    assert await send_inbound(service, [f"abuse@{name}"], report, sender="") == set()
    kept = await poll(
        other, f"/v1/domains/{created['id']}/postmaster-mail", lambda b: b["total"] == 1
    )
    assert kept["items"][0]["subject"] == "Complaint about message from 127.0.0.1"
    email = (await account.client.get(f"/v1/emails/{sent['id']}")).json()
    assert not any(e["event_type"] == "complained" for e in email["events"])
    assert (await account.client.get("/v1/suppressions/")).json()["items"] == []


async def test_other_mail_to_postmaster_is_listed_for_its_workspace_only(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    path = f"/v1/domains/{domain['id']}/postmaster-mail"
    for n in range(3):
        to = f"postmaster@{SENDING_DOMAIN}"
        assert await send_inbound(service, [to], letter(to, f"question {n}")) == set()
    large = letter(f"abuse@{BOUNCE_DOMAIN}", "large", "x" * 100 + "\r\n") * 1
    large += ("y" * 998 + "\r\n").encode() * 300  # ~300 KiB: more than is kept
    assert await send_inbound(service, [f"abuse@{BOUNCE_DOMAIN}"], large) == set()

    first = (await account.client.get(path, params={"limit": 2})).json()
    assert (first["total"], first["page"], first["limit"]) == (4, 0, 2)
    assert [m["subject"] for m in first["items"]] == ["large", "question 2"]
    second = (await account.client.get(path, params={"limit": 2, "page": 1})).json()
    assert [m["subject"] for m in second["items"]] == ["question 1", "question 0"]
    item = second["items"][0]
    assert item["recipient"] == f"postmaster@{SENDING_DOMAIN}"
    assert item["envelope_from"] == "alice@sender.example"
    assert item["from_header"] == "Someone <someone@elsewhere.example>"
    assert item["size_bytes"] > 0 and item["truncated"] is False
    assert item["received_at"].endswith("Z") and "raw" not in item

    detail = (await account.client.get(f"{path}/{item['id']}")).json()
    # As it arrived, under the MX's own trace and results (as every MTA keeps mail).
    assert detail["raw"].startswith("Authentication-Results: mx.postroom.test;")
    assert "\r\nFrom: Someone <someone@elsewhere.example>\r\n" in detail["raw"]
    assert "question 1" in detail["raw"]
    cut = (await account.client.get(f"{path}/{first['items'][0]['id']}")).json()
    assert cut["recipient"] == f"abuse@{BOUNCE_DOMAIN}"
    assert cut["truncated"] is True
    assert len(large) < cut["size_bytes"] < len(large) + 1024  # and the MX's trace fields
    assert len(cut["raw"]) == postmaster.KEPT_OCTETS

    # Another workspace sees none of it, by list or by id; bad paging is a 422.
    other = await service.account("starter")
    assert (await other.client.get(path)).json()["code"] == "not_found"
    assert (await other.client.get(f"{path}/{item['id']}")).status_code == 404
    assert (await account.client.get(path, params={"limit": 0})).status_code == 422
    assert (await account.client.get(path, params={"colour": "red"})).status_code == 422


async def test_a_workspace_keeps_only_its_newest_postmaster_mail(service: Service) -> None:
    account = await service.account("starter")
    db = service.running.runtime.db
    now = service.running.runtime.clock.now()
    ids = [new_id() for _ in range(3)]
    for n, mail_id in enumerate(ids):
        mail = PostmasterMail(
            mail_id, account.workspace_id, "d1", "abuse@a.example", "", "", f"m{n}", "", 1,
            False, now.replace(microsecond=n), b"x",
        )  # fmt: skip
        await db.write(postmaster_mail.keep, mail, 2)
    kept, total = await db.read(postmaster_mail.page, account.workspace_id, "d1", 0, 10)
    assert total == 2 and [m.id for m in kept] == [ids[2], ids[1]]


async def test_erasing_an_address_rewrites_it_out_of_postmaster_mail(
    service: Service, dns_server: DnsServer
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    ann = "ann.lee@elsewhere.example"
    to = f"abuse@{SENDING_DOMAIN}"
    data = letter(to, f"About {ann}").replace(b"someone@elsewhere.example", ann.encode())
    assert await send_inbound(service, [to], data, sender=ann) == set()
    erased = (await account.client.post("/v1/privacy/erase", json={"email": ann})).json()
    assert erased["postmaster_mail"] == 1
    path = f"/v1/domains/{domain['id']}/postmaster-mail"
    [item] = (await account.client.get(path)).json()["items"]
    detail = (await account.client.get(f"{path}/{item['id']}")).json()
    for value in (detail["envelope_from"], detail["from_header"], detail["subject"], detail["raw"]):
        assert ann not in value and "@erased.invalid" in value


async def test_postmaster_mail_past_the_workspaces_retention_is_deleted(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    account, domain = await with_bounce_domain(service, dns_server)
    assert (await account.client.put("/v1/privacy/retention", json={"days": 1})).is_success
    to = f"postmaster@{SENDING_DOMAIN}"
    assert await send_inbound(service, [to], letter(to, "old")) == set()
    # Time moves only once the sweeper waits again with its next hour set: moved while its
    # round runs, the hour would be counted from after the jump (an hour of real time).
    await service.settled()
    clock.jump(23 * 3600)
    assert await send_inbound(service, [to], letter(to, "new")) == set()
    path = f"/v1/domains/{domain['id']}/postmaster-mail"
    await service.settled()
    clock.jump(2 * 3600)  # "old" is past the day, "new" within it; the sweeper's hour passed
    [kept] = (await poll(account, path, lambda b: b["total"] == 1))["items"]
    assert kept["subject"] == "new"


async def test_the_checker_finds_a_new_bounce_domains_records_without_a_verify_call(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    account, domain = await with_bounce_domain(service, dns_server, publish=False)
    path = f"/v1/domains/{domain['id']}"
    dns_server.set(BOUNCE_DOMAIN, "MX", [f"10 {SMTP_HOST}."])
    dns_server.set(BOUNCE_DOMAIN, "TXT", [f"v=spf1 a:{SMTP_HOST} ~all"])
    clock.jump(INTERVAL.total_seconds() + 1)
    checked = await poll(
        account, path, lambda d: {r["status"] for r in bounce_records(d).values()} == {"verified"}
    )
    assert checked["status"] == "verified"
    log = (await account.client.get("/v1/audit-log", params={"category": "domain"})).json()
    # The checker's rounds changed no status: nothing logged beyond the person's own actions.
    assert all(entry["actor"] == account.email for entry in log["items"])
