"""Bounce reports (RFC 3464 DSNs) and complaints (RFC 5965 ARF) sent to an email's bounce
address: read without I/O, then end to end through the inbound server, where they mark the
recipient bounced or complained, fire the events and suppress the address."""

from __future__ import annotations

from typing import Any

from engine.mail import reports
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import poll, send_inbound
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

RECIPIENT = "ann@customer.example"


def dsn(to: str, action: str = "failed", status: str = "5.1.1") -> bytes:
    """A DSN as remote MTAs write them: a human part, the status fields, the headers."""
    return (
        f"From: Mail Delivery System <MAILER-DAEMON@customer.example>\r\n"
        f"To: {to}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b1"\r\n'
        "\r\n"
        "--b1\r\n"
        "Content-Type: text/plain\r\n"
        "\r\n"
        "Your message could not be delivered.\r\n"
        "--b1\r\n"
        "Content-Type: message/delivery-status\r\n"
        "\r\n"
        "Reporting-MTA: dns; mx.customer.example\r\n"
        "\r\n"
        f"Final-Recipient: rfc822; {RECIPIENT.upper()}\r\n"
        f"Action: {action}\r\n"
        f"Status: {status}\r\n"
        f"Diagnostic-Code: smtp; {status[0]}50 {status} mailbox\r\n"
        "  unavailable\r\n"
        "\r\n"
        "--b1\r\n"
        "Content-Type: text/rfc822-headers\r\n"
        "\r\n"
        f"To: {RECIPIENT}\r\n"
        "Subject: Your receipt\r\n"
        "--b1--\r\n"
    ).encode()


def arf(to: str, redacted: bool = False) -> bytes:
    original = "redacted@customer.example" if redacted else RECIPIENT
    return (
        "From: Feedback Loop <fbl@customer.example>\r\n"
        f"To: {to}\r\n"
        "Subject: Abuse report\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=feedback-report; boundary="b2"\r\n'
        "\r\n"
        "--b2\r\n"
        "Content-Type: text/plain\r\n"
        "\r\n"
        "A user marked this message as spam.\r\n"
        "--b2\r\n"
        "Content-Type: message/feedback-report\r\n"
        "\r\n"
        "Feedback-Type: abuse\r\n"
        "User-Agent: ExampleFBL/1.0\r\n"
        "Version: 1\r\n"
        "\r\n"
        "--b2\r\n"
        "Content-Type: message/rfc822\r\n"
        "\r\n"
        "From: hello@mail.example.org\r\n"
        f"To: {original}\r\n"
        "Subject: Your receipt\r\n"
        "\r\n"
        "Thanks for your order.\r\n"
        "--b2--\r\n"
    ).encode()


def test_a_failed_dsn_is_read_with_its_recipient_status_and_diagnostic() -> None:
    report = reports.parse(dsn("bounces+x@mail.example.org"))
    assert report is not None and report.kind == "dsn"
    [entry] = report.statuses
    assert entry.recipient == RECIPIENT
    assert entry.status == "5.1.1"
    assert entry.permanent and not entry.delayed
    assert entry.diagnostic == "smtp; 550 5.1.1 mailbox unavailable"


def test_a_delayed_dsn_is_not_permanent() -> None:
    report = reports.parse(dsn("b@x.example", action="delayed", status="4.2.2"))
    assert report is not None
    [entry] = report.statuses
    assert entry.delayed and not entry.permanent


def test_an_arf_report_names_the_original_recipient_and_feedback_type() -> None:
    report = reports.parse(arf("bounces+x@mail.example.org"))
    assert report is not None and report.kind == "arf"
    assert report.feedback_type == "abuse"
    assert report.complainants == (RECIPIENT,)


def test_other_mail_is_not_a_report() -> None:
    assert reports.parse(b"From: a@b.example\r\nSubject: out of office\r\n\r\nAway.\r\n") is None
    assert reports.parse(b"\x00\xff garbage") is None
    mixed = dsn("x@y.example").replace(b"report-type=delivery-status", b"report-type=other")
    assert reports.parse(mixed) is None


async def delivered_email(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> tuple[Account, str, str]:
    """An email delivered to RECIPIENT: the account, the email id, its bounce address."""
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    sent = (await account.client.post("/v1/emails/", json=message(RECIPIENT))).json()
    [received] = await smtp_sink.wait_for_messages(1)
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"
    return account, sent["id"], received.mail_from


async def suppression(account: Account) -> dict[str, Any] | None:
    items = (await account.client.get("/v1/suppressions/")).json()["items"]
    found = [s for s in items if s["email"] == RECIPIENT]
    return found[0] if found else None


async def test_a_failed_dsn_bounces_the_recipient_and_suppresses_it(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, email_id, bounce_address = await delivered_email(service, dns_server, smtp_sink)
    refused = await send_inbound(service, [bounce_address], dsn(bounce_address), sender="")
    assert refused == set()
    email = await wait_for_status(account, email_id, ("bounced",))
    bounced = [e for e in email["events"] if e["event_type"] == "bounced"]
    assert len(bounced) == 1
    assert bounced[0]["recipient"] == RECIPIENT
    assert bounced[0]["metadata"]["dsn"] == "5.1.1"
    assert bounced[0]["metadata"]["bounce_type"] == "hard"
    entry = await suppression(account)
    assert entry is not None
    assert entry["reason"] == "hard_bounce"
    assert entry["source_email_id"] == email_id
    # The same report again changes nothing.
    await send_inbound(service, [bounce_address], dsn(bounce_address), sender="")
    again = (await account.client.get(f"/v1/emails/{email_id}")).json()
    assert [e["event_type"] for e in again["events"]].count("bounced") == 1


async def test_a_delayed_dsn_is_recorded_only(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, email_id, bounce_address = await delivered_email(service, dns_server, smtp_sink)
    report = dsn(bounce_address, action="delayed", status="4.4.7")
    assert await send_inbound(service, [bounce_address], report, sender="") == set()
    email = await poll(
        account,
        f"/v1/emails/{email_id}",
        lambda e: any(x["event_type"] == "deferred" for x in e["events"]),
    )
    assert email["status"] == "delivered"
    assert await suppression(account) is None


async def test_a_complaint_marks_the_email_complained_and_suppresses(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, email_id, bounce_address = await delivered_email(service, dns_server, smtp_sink)
    # Providers redact the complainant; the bounce address names the email, and the email
    # has one recipient.
    assert (
        await send_inbound(service, [bounce_address], arf(bounce_address, redacted=True)) == set()
    )
    email = await poll(
        account,
        f"/v1/emails/{email_id}",
        lambda e: any(x["event_type"] == "complained" for x in e["events"]),
    )
    [complained] = [e for e in email["events"] if e["event_type"] == "complained"]
    assert complained["recipient"] == RECIPIENT
    assert complained["metadata"]["feedback_type"] == "abuse"
    entry = await suppression(account)
    assert entry is not None and entry["reason"] == "complaint"
