"""A stock Debian Postfix as the relay's client (tests/harness/postfix.py): a message with a
raw UTF-8 Subject, injected with `sendmail -C`, reaches the sink through Postroom intact and
DKIM-valid; as UTF-8 where the next hop offers SMTPUTF8, downgraded (RFC 2047) where not.
Before SMTPUTF8 was offered, Postfix bounced such a message with "5.6.7 SMTPUTF8 is
required, but was not offered" (issue 30)."""

from __future__ import annotations

import email
import email.policy

import pytest
import trio

from tests.harness import postfix
from tests.harness.dns_server import DnsServer
from tests.harness.relay import relay_account
from tests.harness.sending import SENDER, dkim_verifies
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

pytestmark = pytest.mark.skipif(not postfix.POSTFIX.exists(), reason=postfix.MISSING)

SUBJECT = "Caf\u00e9 \u4f1a\u8b70 \U0001f4e8 " + " ".join(["r\u00e9sum\u00e9"] * 12)


def message(to: str) -> bytes:
    return f"From: Z\u00f6e <{SENDER}>\r\nTo: {to}\r\nSubject: {SUBJECT}\r\n\r\nHi.\r\n".encode()


async def test_postfix_relays_a_raw_utf8_subject_through_postroom(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    login = (credential["username"], credential["password"])
    async with postfix.running(service.submission_address, login, tls_ca.ca_file) as instance:
        smtp_sink.smtputf8 = True
        await instance.sendmail(SENDER, ["ann@customer.example"], message("ann@customer.example"))
        with trio.fail_after(30):
            [utf8] = await smtp_sink.wait_for_messages(1, timeout=30)
        smtp_sink.smtputf8 = False
        smtp_sink.hang_up()  # from its next connection on: the one kept idle is dropped
        await instance.sendmail(SENDER, ["bob@customer.example"], message("bob@customer.example"))
        with trio.fail_after(30):
            [_, downgraded] = await smtp_sink.wait_for_messages(2, timeout=30)
        log = instance.log_text()
    assert log.count("status=sent") == 2 and "status=bounced" not in log, log
    assert utf8.smtputf8 and f"\r\nSubject: {SUBJECT}\r\n".encode() in b"\r\n" + utf8.data
    assert not downgraded.smtputf8 and downgraded.data.split(b"\r\n\r\n")[0].isascii()
    for received in (utf8, downgraded):
        parsed = email.message_from_bytes(received.data, policy=email.policy.default)
        assert parsed["subject"] == SUBJECT
        assert parsed.get_content().strip() == "Hi."
        assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
