"""ARC on forwarded mail (RFC 8617): what our inbound MX found on arrival reaches the
final receiver in a chain that dkimpy's `arc_verify` passes, as the sink receives it."""

from __future__ import annotations

import dkim
import dns.message
import dns.query
import trio

from engine.domains import dkim_keys
from engine.mail import arc
from engine.mail.dkim import sign
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import (
    DESTINATION,
    SOURCE,
    forwarding_account,
    letter,
    rule,
    send_inbound,
)
from tests.harness.sending import dkim_verifies, route_mail
from tests.harness.service import SMTP_HOST, Service
from tests.harness.smtp_sink import SmtpSink


def _lookup(dns_server: DnsServer):  # type: ignore[no-untyped-def]
    def lookup(name: bytes, timeout: int = 5) -> bytes:
        query = dns.message.make_query(name.decode().rstrip("."), "TXT")
        answer = dns.query.tcp(query, dns_server.host, port=dns_server.port, timeout=timeout)
        return b"".join(b"".join(rdata.strings) for rrset in answer.answer for rdata in rrset)

    return lookup


def _field(data: bytes, name: bytes) -> str:
    """One header field's unfolded value (the first occurrence)."""
    header = data.split(b"\r\n\r\n", 1)[0].decode()
    lines = header.split("\r\n")
    for i, line in enumerate(lines):
        if line.lower().startswith(name.decode().lower() + ":"):
            value = [line.split(":", 1)[1]]
            value += [x for x in _continuation(lines[i + 1 :])]
            return " ".join(" ".join(value).split())
    raise AssertionError(f"no {name!r} field")


def _continuation(lines: list[str]) -> list[str]:
    taken = []
    for line in lines:
        if not line[:1].isspace():
            break
        taken.append(line)
    return taken


async def test_forwarded_copy_carries_an_arc_chain_that_verifies(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    forward = rule(domain, destination_emails=[DESTINATION])
    assert (await account.client.post("/v1/forwards/", json=forward)).status_code == 201
    # The original sender signs its mail and publishes DMARC.
    key = await dkim_keys.generate()
    dns_server.set(
        f"{key.selector}._domainkey.sender.example", "TXT", [dkim_keys.txt_value(key.public_b64)]
    )
    dns_server.set("_dmarc.sender.example", "TXT", ["v=DMARC1; p=reject"])
    # A forged verdict claiming to be our MX's must not pass for ours.
    forged = f"Authentication-Results: {SMTP_HOST}; dkim=pass header.d=bank.example\r\n".encode()
    signed = sign(
        forged + letter(subject="Signed"),
        domain="sender.example",
        selector=key.selector,
        private_key_pem=key.private_pem,
    )
    assert await send_inbound(service, [SOURCE], signed) == set()

    [copy] = await smtp_sink.wait_for_messages(1)
    cv, results, reason = await trio.to_thread.run_sync(
        lambda: dkim.arc_verify(copy.data, dnsfunc=_lookup(dns_server))
    )
    assert cv == dkim.CV_Pass, reason
    assert [r["instance"] for r in results] == [1]
    seal = _field(copy.data, b"ARC-Seal")
    assert "i=1" in seal and "cv=none" in seal and f"d={domain['name']}" in seal
    found = _field(copy.data, b"ARC-Authentication-Results")
    assert found.startswith(f"i=1; {SMTP_HOST};")
    assert f"dkim=pass header.d=sender.example header.s={key.selector}" in found
    assert "dmarc=pass header.from=sender.example" in found
    assert "bank.example" not in found and b"bank.example" not in copy.data
    # Our DKIM signature over the sealed copy, and the original's, both still verify.
    assert await trio.to_thread.run_sync(dkim_verifies, copy.data, dns_server, 0)
    original = [i for i, _ in enumerate(copy.data.split(b"DKIM-Signature:")[1:])][-1]
    assert await trio.to_thread.run_sync(dkim_verifies, copy.data, dns_server, original)


async def test_unsigned_mail_is_sealed_with_what_could_be_found(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    forward = rule(domain, destination_emails=[DESTINATION])
    assert (await account.client.post("/v1/forwards/", json=forward)).status_code == 201
    assert await send_inbound(service, [SOURCE], letter(subject="Unsigned")) == set()

    [copy] = await smtp_sink.wait_for_messages(1)
    cv, _, reason = await trio.to_thread.run_sync(
        lambda: dkim.arc_verify(copy.data, dnsfunc=_lookup(dns_server))
    )
    assert cv == dkim.CV_Pass, reason
    # No signature to verify, and sender.example publishes no DMARC record here.
    found = _field(copy.data, b"ARC-Authentication-Results")
    assert found == f"i=1; {SMTP_HOST}; dmarc=none header.from=sender.example"
    received = _field(copy.data, b"Received")
    assert received.startswith("from ") and f"by {SMTP_HOST} (Postroom) with ESMTP" in received


async def test_a_message_too_large_to_verify_is_forwarded_signed_but_unsealed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    route_mail(dns_server, "elsewhere.example")
    forward = rule(domain, destination_emails=[DESTINATION])
    assert (await account.client.post("/v1/forwards/", json=forward)).status_code == 201
    key = await dkim_keys.generate()
    lines = (b"y" * 76 + b"\r\n") * (arc.MAX_SIZE // 78 + 1)
    large = letter(subject="Large").replace(b"Plain words.\r\n", b"Plain words.\r\n" + lines)
    signed = sign(
        large, domain="sender.example", selector=key.selector, private_key_pem=key.private_pem
    )
    assert await send_inbound(service, [SOURCE], signed) == set()

    [copy] = await smtp_sink.wait_for_messages(1)
    assert b"ARC-Seal:" not in copy.data
    found = _field(copy.data, b"Authentication-Results")
    assert found.startswith(f"{SMTP_HOST}; dkim=neutral")
    assert await trio.to_thread.run_sync(dkim_verifies, copy.data, dns_server, 0)
