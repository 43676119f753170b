"""Mail to the bounce domain as tests send it: an account whose domain has one (its records
published or not), a letter from elsewhere, a mailbox provider's complaint (ARF) and a
relaying Postfix's bounce (DSN)."""

from __future__ import annotations

from typing import Any

from storage.codec import new_id
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDING_DOMAIN, ready_account
from tests.harness.service import SMTP_HOST, Account, Service

BOUNCE_DOMAIN = f"bounces.{SENDING_DOMAIN}"


async def only_domain(account: Account) -> dict[str, Any]:
    """The account's one domain, as the API shows it."""
    [domain] = (await account.client.get("/v1/domains/")).json()
    return dict(domain)


async def with_bounce_domain(
    service: Service, dns_server: DnsServer, *, publish: bool = True
) -> tuple[Account, dict[str, Any]]:
    """An account whose verified domain has BOUNCE_DOMAIN, its records published (or not)."""
    account = await ready_account(service, dns_server)
    domain = await only_domain(account)
    changed = await account.client.patch(
        f"/v1/domains/{domain['id']}", json={"bounce_domain": BOUNCE_DOMAIN.upper() + "."}
    )
    assert changed.status_code == 200, changed.text
    if publish:
        dns_server.set(BOUNCE_DOMAIN, "MX", [f"10 {SMTP_HOST}."])
        dns_server.set(BOUNCE_DOMAIN, "TXT", [f"v=spf1 a:{SMTP_HOST} ~all"])
    checked = (await account.client.post(f"/v1/domains/{domain['id']}/verify")).json()
    return account, checked


def feedback_report(to: str, message_id: str, return_path: str | None = None) -> bytes:
    """An ARF report (RFC 5965) as a mailbox provider's feedback loop sends it: the
    complainant redacted, the original quoted with its Message-ID."""
    quoted = f"Return-Path: <{return_path}>\r\n" if return_path else ""
    return (
        "From: Feedback Loop <fbl@provider.example>\r\n"
        f"To: {to}\r\n"
        "Subject: Complaint about message from 127.0.0.1\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=feedback-report; boundary="fb"\r\n'
        "\r\n--fb\r\nContent-Type: text/plain\r\n\r\nA user marked this as spam.\r\n"
        "--fb\r\nContent-Type: message/feedback-report\r\n\r\n"
        "Feedback-Type: abuse\r\nUser-Agent: ProviderFBL/2.0\r\nVersion: 1\r\n\r\n"
        "--fb\r\nContent-Type: message/rfc822\r\n\r\n"
        f"{quoted}From: Hello <hello@{SENDING_DOMAIN}>\r\n"
        "To: redacted@customer.example\r\n"
        f"Message-ID: {message_id}\r\n"
        "Subject: Your receipt\r\n\r\nThanks for your order.\r\n"
        "--fb--\r\n"
    ).encode()


def letter(to: str, subject: str, body: str = "Hello.\r\n") -> bytes:
    return (
        f"From: Someone <someone@elsewhere.example>\r\nTo: {to}\r\nSubject: {subject}\r\n"
        f"Message-ID: <{new_id()}@elsewhere.example>\r\n\r\n{body}"
    ).encode()


def postfix_dsn(bounce_address: str, failures: list[tuple[str, str, str]]) -> bytes:
    """A DSN as a relaying Postfix writes it: per recipient its status and the reply it got."""
    blocks = "".join(
        f"Final-Recipient: rfc822; {address}\r\n"
        f"Original-Recipient: rfc822;{address}\r\n"
        "Action: failed\r\n"
        f"Status: {status}\r\n"
        "Remote-MTA: dns; mx.relay.example\r\n"
        f"Diagnostic-Code: smtp; {reply}\r\n"
        "\r\n"
        for address, status, reply in failures
    )
    return (
        "From: MAILER-DAEMON@relay.example (Mail Delivery System)\r\n"
        f"To: {bounce_address}\r\n"
        "Subject: Undelivered Mail Returned to Sender\r\n"
        "MIME-Version: 1.0\r\n"
        'Content-Type: multipart/report; report-type=delivery-status; boundary="b1"\r\n'
        "\r\n--b1\r\nContent-Type: text/plain\r\n\r\nI'm sorry to have to inform you...\r\n"
        "--b1\r\nContent-Type: message/delivery-status\r\n\r\n"
        "Reporting-MTA: dns; relay.example\r\nX-Postfix-Queue-ID: 4ABC\r\n\r\n"
        f"{blocks}"
        "--b1\r\nContent-Type: text/rfc822-headers\r\n\r\nSubject: Your receipt\r\n"
        "--b1--\r\n"
    ).encode()
