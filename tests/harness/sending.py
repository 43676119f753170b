"""Sending as tests set it up: an account with a verified domain and sender (and that domain's
id), recipients' mail routed to the SMTP sink, a message body, mail scheduled for later, waits
on an email's state, and DKIM verification."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

import dkim
import dns.message
import dns.query
import trio

from tests.harness.dns_server import DnsServer
from tests.harness.service import Account, Service

SENDING_DOMAIN = "mail.example.org"
SENDER = f"hello@{SENDING_DOMAIN}"
FINAL = ("delivered", "bounced", "failed", "rejected", "cancelled")


async def ready_account(service: Service, dns_server: DnsServer, plan: str = "starter") -> Account:
    """An account with a verified domain and a registered sender."""
    account = await service.account(plan)
    domain = (await account.client.post("/v1/domains/", json={"name": SENDING_DOMAIN})).json()
    dkim_record = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
    dns_server.set(dkim_record["host"], "TXT", [dkim_record["value"]])
    verified = await account.client.post(f"/v1/domains/{domain['id']}/verify")
    assert verified.json()["status"] == "verified"
    created = await account.client.post("/v1/senders/", json={"email": SENDER, "name": "Hello"})
    assert created.status_code == 201
    return account


def route_mail(dns_server: DnsServer, domain: str) -> None:
    dns_server.set(domain, "MX", [f"10 mx.{domain}."])
    dns_server.set(f"mx.{domain}", "A", ["127.0.0.1"])


def message(to: str | list[str], **extra: Any) -> dict[str, Any]:
    recipients = [to] if isinstance(to, str) else to
    body: dict[str, Any] = {
        "from_": {"email": SENDER, "name": "Hello"},
        "to": [{"email": r} for r in recipients],
        "subject": "Your receipt",
        "text": "Thanks for your order.",
        "html": "<p>Thanks for your <b>order</b>.</p>",
    }
    body.update(extra)
    return body


async def wait_for_email(
    account: Account, email_id: str, done: Callable[[dict[str, Any]], bool]
) -> dict[str, Any]:
    """Poll the email's detail until `done` says so (the engine works in the background)."""
    with trio.fail_after(15):
        while True:
            email: dict[str, Any] = (await account.client.get(f"/v1/emails/{email_id}")).json()
            if done(email):
                return email
            await trio.sleep(0.05)


async def wait_for_status(
    account: Account, email_id: str, wanted: tuple[str, ...] = FINAL
) -> dict[str, Any]:
    return await wait_for_email(account, email_id, lambda email: email["status"] in wanted)


def dkim_verifies(data: bytes, dns_server: DnsServer, index: int = 0) -> bool:
    """Whether dkimpy verifies the message's DKIM signature number `index` (0: the top one)."""

    def lookup(name: bytes, timeout: int = 5) -> bytes:
        query = dns.message.make_query(name.decode().rstrip("."), "TXT")
        answer = dns.query.tcp(query, dns_server.host, port=dns_server.port, timeout=timeout)
        return b"".join(b"".join(rdata.strings) for rrset in answer.answer for rdata in rrset)

    return bool(dkim.DKIM(data).verify(idx=index, dnsfunc=lookup))


async def schedule(account: Account, addresses: list[str], send_at: datetime) -> list[str]:
    """One email per address, all due at `send_at`."""
    ids = []
    for address in addresses:
        body = message(address, send_at=send_at.isoformat())
        response = await account.client.post("/v1/emails/", json=body)
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


async def settled(account: Account, ids: list[str]) -> list[dict[str, Any]]:
    """Each email once it is delivered or waiting (deferred)."""
    return [
        await wait_for_email(account, i, lambda e: e["status"] in ("delivered", "deferred"))
        for i in ids
    ]


async def only_domain_id(account: Account) -> str:
    """The id of the account's one domain (as `ready_account` made it)."""
    [domain] = (await account.client.get("/v1/domains/")).json()
    return str(domain["id"])
