"""The SMTP relay as tests use it: an account with an SMTP credential, a message, a
submission as a mail client makes it, and a reply line read off a bare socket."""

from __future__ import annotations

import smtplib
from typing import Any

import trio

from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, ready_account, route_mail
from tests.harness.service import Account, Service
from tests.harness.tls import TlsAuthority


async def relay_account(service: Service, dns_server: DnsServer) -> tuple[Account, dict[str, Any]]:
    """An account with a verified domain, a sender and an SMTP credential for the domain."""
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    [domain] = (await account.client.get("/v1/domains/")).json()
    created = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    assert created.status_code == 201
    return account, created.json()


def mime(subject: str, to: str = "ann@customer.example", sender: str = SENDER) -> str:
    return f"From: Hello <{sender}>\r\nTo: {to}\r\nSubject: {subject}\r\n\r\nHello there.\r\n"


def submit(
    service: Service,
    tls_ca: TlsAuthority,
    credential: dict[str, Any],
    recipients: list[str],
    message: str,
    *,
    mechanism: str = "PLAIN",
    mail_from: str = SENDER,
) -> dict[str, tuple[int, bytes]]:
    """Send one message through the relay as a mail client does (blocking: run in a thread)."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.ehlo()
        smtp.user, smtp.password = credential["username"], credential["password"]
        method = smtp.auth_plain if mechanism == "PLAIN" else smtp.auth_login
        smtp.auth(mechanism, method, initial_response_ok=mechanism == "PLAIN")
        refused: dict[str, tuple[int, bytes]] = smtp.sendmail(mail_from, recipients, message)
        return refused


async def reply_line(stream: trio.SocketStream) -> bytes:
    """The server's next reply line, or what it sent before closing."""
    received = b""
    with trio.fail_after(10):
        while not received.endswith(b"\r\n"):
            chunk = await stream.receive_some()
            if not chunk:
                break
            received += chunk
    return received
