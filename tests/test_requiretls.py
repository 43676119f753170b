"""REQUIRETLS (RFC 8689, issue 31) through the real relay: smtplib submits over STARTTLS with
`MAIL FROM:<...> REQUIRETLS`; the email goes only to an MX reached over TLS that DANE
verified (a real DNS server setting the AD bit, a real sink) and that offers REQUIRETLS
itself, else it fails with 5.7.30 and nothing is sent."""

from __future__ import annotations

import smtplib
from contextlib import AbstractAsyncContextManager
from typing import Any

import trio

from engine.smtp.server import MailFrom, MessageData, ServerPolicy, SmtpServer
from tests.harness import service as harness
from tests.harness import tls_policies
from tests.harness.relay import mime, relay_account
from tests.harness.sending import SENDER, wait_for_email
from tests.harness.service import Account, Service
from tests.harness.smtp_machine import authenticated, codes, run
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority
from tests.harness.tls_policies import (
    DOMAIN,
    MX,
    Loopback,
    dane_sink,
    events_of,
    is_delivered,
    publish_tlsa,
    spki_sha256,
)

# The peers of tests/harness/tls_policies.py (a DNS server, an HTTPS policy server, the test CA).
loopback = tls_policies.loopback
policy_server = tls_policies.policy_server


def _service(loopback: Loopback, sink: SmtpSink) -> AbstractAsyncContextManager[Service]:
    relay_pem = loopback.tls_ca.ca_file.parent / "relay-key-and-chain.pem"
    if not relay_pem.exists():
        loopback.tls_ca.server_cert.private_key_and_cert_chain_pem.write_to_path(str(relay_pem))
    settings = harness.test_settings(
        loopback.database_url,
        loopback.dns,
        delivery_port=str(sink.port),
        extra_ca_file=str(loopback.tls_ca.ca_file),
        tls_cert=str(relay_pem),
        tls_key=str(relay_pem),
        dnssec="on",
    )
    return harness.started(loopback.nursery, settings, loopback.clock)


def _submit(
    service: Service, tls_ca: TlsAuthority, credential: dict[str, Any], requiretls: bool
) -> tuple[bool, bool, str]:
    """Submit one message (blocking: run in a thread): whether EHLO offered REQUIRETLS before
    and after STARTTLS, and the id the relay queued the email under."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.ehlo()
        before = smtp.has_extn("requiretls")
        smtp.starttls(context=tls_ca.client_context())
        smtp.ehlo()
        after = smtp.has_extn("requiretls")
        smtp.login(credential["username"], credential["password"])
        code, _ = smtp.mail(SENDER, ["REQUIRETLS"] if requiretls else [])
        assert code == 250
        assert smtp.rcpt(f"ann@{DOMAIN}")[0] == 250
        code, reply = smtp.data(mime("Secret"))
        assert code == 250, reply
        return before, after, reply.decode().rsplit(" ", 1)[1]


async def _relayed(
    service: Service, loopback: Loopback, sink: SmtpSink, tlsa: str | None = None
) -> tuple[Account, Any, str]:
    """An account with an SMTP credential, and the id of one email it relayed with
    REQUIRETLS; with `tlsa`, the MX host has that TLSA record (DANE) before it is sent."""
    account, credential = await relay_account(service, loopback.dns)
    if tlsa is not None:
        publish_tlsa(loopback, sink, tlsa)
    before, after, email_id = await trio.to_thread.run_sync(
        _submit, service, loopback.tls_ca, credential, True
    )
    assert (before, after) == (False, True)  # offered over TLS only
    return account, credential, email_id


def _failed(email: dict[str, Any]) -> bool:
    return bool(email["status"] == "failed")


async def test_requiretls_mail_goes_over_dane_verified_tls_and_passes_it_on(
    loopback: Loopback,
) -> None:
    sink, chain = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    sink.requiretls = True
    async with _service(loopback, sink) as service:
        tlsa = f"3 1 1 {spki_sha256(chain[0])}"
        account, _, email_id = await _relayed(service, loopback, sink, tlsa)
        done = await wait_for_email(account, email_id, is_delivered)
        [delivered] = events_of(done, "delivered")
        assert delivered["policy"] == "dane" and delivered["tls"]["verified"] is True
        [mail] = [line for line in sink.transcript if line.startswith("MAIL")]
        assert mail.endswith(" REQUIRETLS")


async def test_requiretls_mail_fails_with_5_7_30_when_the_mx_lacks_requiretls(
    loopback: Loopback,
) -> None:
    sink, chain = await dane_sink(loopback, loopback.tls_ca.ca, MX)  # verified, no REQUIRETLS
    async with _service(loopback, sink) as service:
        tlsa = f"3 1 1 {spki_sha256(chain[0])}"
        account, _, email_id = await _relayed(service, loopback, sink, tlsa)
        done = await wait_for_email(account, email_id, _failed)
        [failed] = events_of(done, "failed")
        assert failed["dsn"] == "5.7.30" and "REQUIRETLS support required" in failed["error"]
        assert sink.messages == [] and not any(line.startswith("MAIL") for line in sink.transcript)
        suppressions = (await account.client.get("/v1/suppressions/")).json()["items"]
        assert suppressions == []  # the recipient is not to blame


async def test_requiretls_mail_fails_without_a_verified_policy_and_other_mail_goes(
    loopback: Loopback,
) -> None:
    sink, _ = await dane_sink(loopback, loopback.tls_ca.ca, MX)
    sink.requiretls = True  # offered, but nothing verifies the host: opportunistic TLS
    async with _service(loopback, sink) as service:
        account, credential, email_id = await _relayed(service, loopback, sink)
        done = await wait_for_email(account, email_id, _failed)
        [failed] = events_of(done, "failed")
        assert failed["dsn"] == "5.7.30"
        assert sink.messages == []
        # The same message without REQUIRETLS is delivered as usual.
        _, _, other = await trio.to_thread.run_sync(
            _submit, service, loopback.tls_ca, credential, False
        )
        done = await wait_for_email(account, other, is_delivered)
        assert events_of(done, "delivered")[0]["policy"] == "opportunistic"
        [mail] = [line for line in sink.transcript if line.startswith("MAIL")]
        assert "REQUIRETLS" not in mail


def test_the_server_machine_takes_requiretls_over_tls_only_and_where_offered() -> None:
    submission = ServerPolicy(
        "relay.test", 10_000, tls_available=True, auth=True, auth_without_tls=True, requiretls=True
    )
    plain = SmtpServer(submission)
    _, replies = run(plain, b"EHLO client.test\r\n")
    assert b"REQUIRETLS" not in replies
    token = "AHVzZXJAZXhhbXBsZS5vcmcAc2VjcmV0"  # \0user@example.org\0secret
    run(plain, f"AUTH PLAIN {token}\r\n".encode())
    _, replies = run(plain, b"MAIL FROM:<a@example.org> REQUIRETLS\r\n")
    assert codes(replies) == ["555 5.5.4"]  # not offered in plain text

    server = authenticated(submission)
    events, _ = run(
        server,
        b"MAIL FROM:<a@example.org> REQUIRETLS\r\nRCPT TO:<b@example.net>\r\nDATA\r\n"
        b"Subject: x\r\n\r\nhi\r\n.\r\n",
    )
    assert MailFrom("a@example.org", None, False, True) in events
    [message] = [e for e in events if isinstance(e, MessageData)]
    assert message.requiretls

    inbound = authenticated(ServerPolicy("mx.test", 10_000, tls_available=True))
    _, replies = run(inbound, b"EHLO client.test\r\nMAIL FROM:<a@example.org> REQUIRETLS\r\n")
    assert b"REQUIRETLS" not in replies and codes(replies)[-1] == "555 5.5.4"
