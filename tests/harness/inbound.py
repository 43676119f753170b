"""Inbound mail as tests set it up: an account with a verified domain whose MX is the
service, a forwarding rule, a letter, handing it to the inbound MX, and polling the API."""

from __future__ import annotations

import smtplib
from email.message import EmailMessage
from typing import Any

import trio

from engine.forwarding import inbound
from engine.mail import trace
from tests.harness.dns_server import DnsServer
from tests.harness.service import SMTP_HOST, Account, Service

DOMAIN = "in.example.org"
SOURCE = f"support@{DOMAIN}"
DESTINATION = "me@elsewhere.example"


async def verified_domain(
    account: Account, dns_server: DnsServer, name: str = DOMAIN, *, mx: bool = True
) -> dict[str, Any]:
    """A verified domain of the account, its MX pointing at the service unless told not to."""
    domain: dict[str, Any] = (await account.client.post("/v1/domains/", json={"name": name})).json()
    dkim_record = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim_record["host"], "TXT", [dkim_record["value"]])
    verified = await account.client.post(f"/v1/domains/{domain['id']}/verify")
    assert verified.json()["status"] == "verified"
    if mx:
        dns_server.set(name, "MX", [f"10 {SMTP_HOST}."])
    return domain


async def forwarding_account(
    service: Service, dns_server: DnsServer, plan: str = "starter", name: str = DOMAIN
) -> tuple[Account, dict[str, Any]]:
    account = await service.account(plan)
    return account, await verified_domain(account, dns_server, name)


def rule(domain: dict[str, Any], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {"source_email": SOURCE, "domain_id": domain["id"]}
    body.setdefault("destination_emails", ["me@elsewhere.example"])
    body.update(fields)
    return body


def letter(to: str = SOURCE, subject: str = "Hello there", attachment: bool = False) -> bytes:
    message = EmailMessage()
    message["From"] = "Alice Example <alice@sender.example>"
    message["To"] = to
    message["Subject"] = subject
    message["Message-ID"] = "<first-letter@sender.example>"
    message.set_content("Plain words.\n")
    message.add_alternative("<p>Plain <b>words</b>.</p>\n", subtype="html")
    if attachment:
        message.add_attachment(
            b"%PDF-1.4 not really", maintype="application", subtype="pdf", filename="a.pdf"
        )
    return message.as_bytes(policy=message.policy.clone(linesep="\r\n"))


def _smtp_send(address: tuple[str, int], sender: str, rcpts: list[str], data: bytes) -> set[str]:
    with smtplib.SMTP(*address, timeout=10) as client:
        try:
            refused = client.sendmail(sender, rcpts, data)
        except smtplib.SMTPRecipientsRefused as exc:
            return set(exc.recipients)
        return set(refused)


async def send_inbound(
    service: Service, rcpts: list[str], data: bytes, sender: str = "alice@sender.example"
) -> set[str]:
    """Hand a message to the inbound MX server; the recipients it refused.

    Through smtplib once the service runs its inbound listener, else through the engine
    functions that listener calls (accepts per RCPT, receive after DATA).
    """
    address = getattr(service.running, "inbound_address", None)
    if address is not None:
        return await trio.to_thread.run_sync(_smtp_send, address, sender, rcpts, data)
    rt = service.running.runtime
    accepted = [r for r in rcpts if await inbound.accepts(rt, r)]
    if accepted:
        arrival = trace.Arrival("sender.example", "127.0.0.1", None, "ESMTP")
        await inbound.receive(rt, sender, accepted, data, arrival)
    return set(rcpts) - set(accepted)


async def poll(account: Account, path: str, done: Any, **params: Any) -> Any:
    with trio.fail_after(15):
        while True:
            body = (await account.client.get(path, params=params)).json()
            if done(body):
                return body
            await trio.sleep(0.05)
