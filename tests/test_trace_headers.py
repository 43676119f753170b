"""Trace facts of the mail Postroom handles: the `Received:` field the relay prepends
(RFC 5321 4.4) and what a delivered event records of the MX that took the message."""

from __future__ import annotations

import email
import email.policy
import smtplib
from datetime import UTC, datetime
from typing import Any

import trio

from engine.mail.trace import Arrival, received_field
from tests.harness.dns_server import DnsServer
from tests.harness.relay import mime, relay_account
from tests.harness.sending import (
    SENDER,
    dkim_verifies,
    message,
    ready_account,
    route_mail,
    wait_for_status,
)
from tests.harness.service import SMTP_HOST, Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority


def _submit_as(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any], helo: str, text: str
) -> None:
    host, port = service.submission_address
    with smtplib.SMTP(host, port, local_hostname=helo, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.login(credential["username"], credential["password"])
        smtp.sendmail(SENDER, ["ann@customer.example"], text)


async def test_relay_prepends_received_with_confirmed_rdns_before_signing(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    dns_server.set("1.0.0.127.in-addr.arpa", "PTR", ["laptop.client.test."])
    dns_server.set("laptop.client.test", "A", ["127.0.0.1"])
    await trio.to_thread.run_sync(
        _submit_as, service, tls_ca, credential, "laptop.client.test", mime("Traced")
    )
    [received] = await smtp_sink.wait_for_messages(1)
    parsed = email.message_from_bytes(received.data, policy=email.policy.compat32)
    # Our DKIM signature sits above the field (it was signed after the field was added),
    # which sits above the client's own header.
    names = [k.lower() for k in parsed]
    assert names.index("dkim-signature") < names.index("received") < names.index("from")
    trace = " ".join(parsed["Received"].split())
    head, _, date = trace.partition("; ")
    assert head.startswith(
        f"from laptop.client.test (laptop.client.test [127.0.0.1]) by {SMTP_HOST} (Postroom)"
        " with ESMTPSA id "
    )
    assert head.endswith(" for <ann@customer.example>")
    assert email.utils.parsedate_to_datetime(date).tzinfo is not None
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)


async def test_relay_client_without_confirmed_rdns_is_named_by_its_address(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    # A PTR whose name does not resolve back to the client is a claim, not a name.
    dns_server.set("1.0.0.127.in-addr.arpa", "PTR", ["forged.example."])
    dns_server.set("forged.example", "A", ["192.0.2.7"])
    await trio.to_thread.run_sync(
        _submit_as, service, tls_ca, credential, "(odd);helo", mime("Unnamed")
    )
    [received] = await smtp_sink.wait_for_messages(1)
    parsed = email.message_from_bytes(received.data, policy=email.policy.compat32)
    trace = " ".join(parsed["Received"].split())
    assert trace.startswith(f"from unknown ([127.0.0.1]) by {SMTP_HOST} (Postroom) with ESMTPSA")


def test_received_names_a_recipient_only_when_there_is_one() -> None:
    when = datetime(2026, 11, 26, 21, 0, tzinfo=UTC)
    arrival = Arrival("client.test", "2001:db8::1", None, "ESMTPS")
    field = received_field(arrival, "mx.test", "ABC", ["a@x.test", "b@x.test"], when).decode()
    assert field == (
        "Received: from client.test ([IPv6:2001:db8::1])\r\n"
        "\tby mx.test (Postroom) with ESMTPS id ABC; Thu, 26 Nov 2026 21:00:00 +0000\r\n"
    )
    mapped = Arrival("[127.0.0.1]", "::ffff:127.0.0.1", None, "ESMTP")
    field = received_field(mapped, "mx.test", "ABC", ["a@x.test"], when).decode()
    assert field.startswith("Received: from [127.0.0.1] ([127.0.0.1])\r\n")
    assert "\tfor <a@x.test>; Thu, 26 Nov 2026 21:00:00 +0000\r\n" in field


async def test_delivered_event_records_the_mx_host_address_and_tls(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    sent = (await account.client.post("/v1/emails/", json=message("ann@customer.example"))).json()
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.tls
    done = await wait_for_status(account, sent["id"])
    delivered = done["events"][-1]
    assert delivered["event_type"] == "delivered"
    metadata = delivered["metadata"]
    assert metadata["mx_host"] == "mx.customer.example"
    assert metadata["mx_address"] == "127.0.0.1"
    tls = metadata["tls"]
    assert tls["version"] in ("TLSv1.2", "TLSv1.3")
    assert tls["cipher"]  # e.g. TLS_AES_256_GCM_SHA384
    # Opportunistic STARTTLS between MTAs checks no certificate, and says so.
    assert tls["verified"] is False
    assert metadata["policy"] == "opportunistic"  # the domain publishes no MTA-STS
