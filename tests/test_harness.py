"""Proof that the test peers behave like the real thing, checked with real clients.

dnspython's resolver against ``dns_server``, the standard library's ``smtplib`` against
``smtp_sink`` and httpx against ``https_receiver``; no mocks anywhere.
"""

from __future__ import annotations

import smtplib
import ssl
import time
from collections.abc import Callable
from functools import partial
from typing import Any

import dns.asyncquery
import dns.asyncresolver
import dns.flags
import dns.message
import dns.nameserver
import dns.rdtypes.ANY.TXT
import dns.resolver
import httpx
import pytest
import trio

from tests.harness.dns_server import DnsQuery, DnsServer
from tests.harness.https_receiver import MAX_BODY, HttpReply, HttpsReceiver
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

# Shaped like a published DKIM record, and long enough (> 1232 bytes, the usual EDNS
# payload) that no UDP answer can hold it.
LONG_DKIM_TXT = "v=DKIM1; k=rsa; p=" + "MIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA" * 40


# -- DNS ---------------------------------------------------------------------------------


def make_resolver(server: DnsServer) -> dns.asyncresolver.Resolver:
    resolver = dns.asyncresolver.Resolver(configure=False)
    resolver.nameservers = [dns.nameserver.Do53Nameserver(server.host, port=server.port)]
    resolver.lifetime = 5
    return resolver


async def test_dns_answers_mx_a_aaaa_case_insensitively(dns_server: DnsServer) -> None:
    dns_server.set("Example.COM.", "MX", ["10 mx1.example.com.", "20 mx2.example.com"])
    dns_server.set("mx1.example.com", "A", ["127.0.0.1"], ttl=300)
    dns_server.set("mx1.example.com", "AAAA", ["::1"])
    resolver = make_resolver(dns_server)

    mx = await resolver.resolve("example.com", "MX")
    assert sorted((r.preference, r.exchange.to_text()) for r in mx) == [
        (10, "mx1.example.com."),
        (20, "mx2.example.com."),
    ]
    a = await resolver.resolve("MX1.example.com.", "A")
    assert [r.address for r in a] == ["127.0.0.1"]
    assert a.rrset is not None and a.rrset.ttl == 300
    aaaa = await resolver.resolve("mx1.example.com", "AAAA")
    assert [r.address for r in aaaa] == ["::1"]
    assert dns_server.nameserver == f"127.0.0.1:{dns_server.port}"


async def test_dns_long_txt_arrives_whole_through_tcp_fallback(dns_server: DnsServer) -> None:
    dns_server.set("sel._domainkey.example.com", "TXT", [LONG_DKIM_TXT])

    answer = await make_resolver(dns_server).resolve("sel._domainkey.example.com", "TXT")

    rdata = answer[0]
    assert isinstance(rdata, dns.rdtypes.ANY.TXT.TXT)
    assert b"".join(rdata.strings).decode() == LONG_DKIM_TXT
    assert all(len(chunk) <= 255 for chunk in rdata.strings)
    assert [q.transport for q in dns_server.queries] == ["udp", "tcp"]


async def test_dns_truncates_udp_for_clients_without_edns(dns_server: DnsServer) -> None:
    # 39 A records take ~620 bytes: more than the 512 a client without EDNS accepts.
    dns_server.set("many.example.com", "A", [f"127.0.0.{i}" for i in range(1, 40)])
    query = dns.message.make_query("many.example.com", "A")  # no EDNS: 512-byte limit

    udp = await dns.asyncquery.udp(query, dns_server.host, port=dns_server.port, timeout=5)
    tcp = await dns.asyncquery.tcp(query, dns_server.host, port=dns_server.port, timeout=5)

    assert udp.flags & dns.flags.TC
    assert not tcp.flags & dns.flags.TC
    assert len(tcp.answer[0]) == 39


async def test_dns_txt_is_quoted_for_the_client(dns_server: DnsServer) -> None:
    tricky = 'v=spf1 include:"quoted" \\back ünï -all'
    dns_server.set("example.com", "TXT", [tricky, "second record"])

    answer = await make_resolver(dns_server).resolve("example.com", "TXT")

    texts = {b"".join(r.strings).decode() for r in answer}
    assert texts == {tricky, "second record"}


async def test_dns_negative_answers(dns_server: DnsServer) -> None:
    dns_server.set("example.com", "A", ["127.0.0.1"])
    dns_server.set("nomx.example.com", "MX", [])
    resolver = make_resolver(dns_server)

    with pytest.raises(dns.resolver.NXDOMAIN):
        await resolver.resolve("unknown.example.com", "A")
    with pytest.raises(dns.resolver.NoAnswer):
        await resolver.resolve("example.com", "MX")
    with pytest.raises(dns.resolver.NoAnswer):
        await resolver.resolve("nomx.example.com", "MX")


async def test_dns_servfail_and_recovery(dns_server: DnsServer) -> None:
    dns_server.set("flaky.example.com", "MX", ["10 mx.example.com."])
    dns_server.fail("FLAKY.example.com.")
    resolver = make_resolver(dns_server)

    with pytest.raises(dns.resolver.NoNameservers):
        await resolver.resolve("flaky.example.com", "MX")
    dns_server.remove("flaky.example.com")
    with pytest.raises(dns.resolver.NXDOMAIN):
        await resolver.resolve("flaky.example.com", "MX")
    assert DnsQuery("flaky.example.com", "MX", "udp") in dns_server.queries


async def test_dns_remove_one_type_and_clear(dns_server: DnsServer) -> None:
    dns_server.set("example.com", "A", ["127.0.0.1"])
    dns_server.set("example.com", "MX", ["10 example.com."])
    resolver = make_resolver(dns_server)

    dns_server.remove("example.com", "MX")
    with pytest.raises(dns.resolver.NoAnswer):
        await resolver.resolve("example.com", "MX")
    assert len(await resolver.resolve("example.com", "A")) == 1
    dns_server.clear()
    with pytest.raises(dns.resolver.NXDOMAIN):
        await resolver.resolve("example.com", "A")


# -- SMTP --------------------------------------------------------------------------------


def smtp_send(
    sink: SmtpSink,
    rcpt_to: list[str],
    body: bytes = b"Subject: hi\r\n\r\nhello\r\n",
    tls: ssl.SSLContext | None = None,
) -> dict[str, tuple[int, bytes]]:
    """Blocking smtplib client; returns smtplib's refused-recipients dict."""
    with smtplib.SMTP(sink.host, sink.port, timeout=5) as client:
        client.ehlo("client.test")
        if tls is not None:
            client.starttls(context=tls)
            client.ehlo("client.test")
        return client.sendmail("sender@example.org", rcpt_to, body)


async def in_thread(func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return await trio.to_thread.run_sync(partial(func, *args, **kwargs))


async def test_smtp_plain_delivery_is_recorded(smtp_sink: SmtpSink) -> None:
    refused = await in_thread(smtp_send, smtp_sink, ["Alice@example.com"])

    assert refused == {}
    (message,) = await smtp_sink.wait_for_messages(1)
    assert message.mail_from == "sender@example.org"
    assert message.rcpt_to == ("Alice@example.com",)
    assert message.data == b"Subject: hi\r\n\r\nhello\r\n"
    assert message.tls is False
    assert smtp_sink.connections == 1
    assert [line.split()[0] for line in smtp_sink.transcript] == [
        "ehlo",
        "mail",
        "rcpt",
        "data",
        "QUIT",
    ]


async def test_smtp_starttls_delivery(smtp_sink: SmtpSink, tls_ca: TlsAuthority) -> None:
    def send_over_tls() -> tuple[bool, bool]:
        with smtplib.SMTP(smtp_sink.host, smtp_sink.port, timeout=5) as client:
            client.ehlo("client.test")
            offered_before = client.has_extn("starttls")
            client.starttls(context=tls_ca.client_context())
            client.ehlo("client.test")
            offered_after = client.has_extn("starttls")
            client.sendmail("sender@example.org", ["bob@example.com"], b"secret\r\n")
        return offered_before, offered_after

    assert await in_thread(send_over_tls) == (True, False)
    (message,) = await smtp_sink.wait_for_messages(1)
    assert message.tls is True
    assert message.data == b"secret\r\n"


async def test_smtp_tempfail_and_permfail_recipients(smtp_sink: SmtpSink) -> None:
    rcpts = ["ok@example.com", "tempfail-1@example.com", "PermFail@example.com"]

    refused = await in_thread(smtp_send, smtp_sink, rcpts)

    assert refused == {
        "tempfail-1@example.com": (450, b"4.2.0 try again later"),
        "PermFail@example.com": (550, b"5.1.1 no such user"),
    }
    (message,) = await smtp_sink.wait_for_messages(1)
    assert message.rcpt_to == ("ok@example.com",)


async def test_smtp_no_data_when_every_recipient_fails(smtp_sink: SmtpSink) -> None:
    smtp_sink.reply_for("blocked@example.com", 550, "5.7.1 blocked by policy")

    with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
        await in_thread(smtp_send, smtp_sink, ["blocked@example.com"])

    assert refused.value.recipients == {"blocked@example.com": (550, b"5.7.1 blocked by policy")}
    assert smtp_sink.messages == []
    assert not any(line.lower() == "data" for line in smtp_sink.transcript)


async def test_smtp_dot_stuffed_lines_arrive_unstuffed(smtp_sink: SmtpSink) -> None:
    body = b"Subject: dots\r\n\r\n.\r\n..two\r\n.one\r\nend\r\n"

    await in_thread(smtp_send, smtp_sink, ["dots@example.com"], body)

    (message,) = await smtp_sink.wait_for_messages(1)
    assert message.data == body


async def test_smtp_fail_first_then_accept(smtp_sink: SmtpSink) -> None:
    smtp_sink.fail_first("retry@example.com", 2)

    for _ in range(2):
        with pytest.raises(smtplib.SMTPRecipientsRefused) as refused:
            await in_thread(smtp_send, smtp_sink, ["retry@example.com"])
        assert refused.value.recipients["retry@example.com"][0] == 451
    assert await in_thread(smtp_send, smtp_sink, ["retry@example.com"]) == {}

    assert len(smtp_sink.messages) == 1
    assert smtp_sink.connections == 3


async def test_smtp_data_reply_fails_next_messages(smtp_sink: SmtpSink) -> None:
    smtp_sink.data_reply(451, "4.3.0 queue full", count=1)

    with pytest.raises(smtplib.SMTPDataError) as failed:
        await in_thread(smtp_send, smtp_sink, ["a@example.com"])
    assert failed.value.smtp_code == 451
    await in_thread(smtp_send, smtp_sink, ["a@example.com"])

    assert len(smtp_sink.messages) == 1


async def test_smtp_limits(nursery: trio.Nursery) -> None:
    sink = SmtpSink(max_message_size=1000)
    await nursery.start(sink.run)

    def exercise() -> list[tuple[int, bytes]]:
        with smtplib.SMTP(sink.host, sink.port, timeout=5) as client:
            client.ehlo("client.test")
            replies = [
                client.docmd("NOOP " + "x" * 5000),
                client.docmd("MAIL FROM:<a@example.org> SIZE=5000"),
                client.docmd("MAIL FROM:<a@example.org> SMTPUTF8"),
                client.docmd("MAIL FROM:<a@example.org>"),
                client.docmd("RCPT TO:<b@example.com>"),
                client.docmd("DATA"),
            ]
            client.send((b"y" * 80 + b"\r\n") * 20 + b".\r\n")  # 1640 bytes > 1000
            replies.append(client.getreply())
            replies.append(client.docmd("NOOP"))
            return replies

    replies = await in_thread(exercise)

    assert [code for code, _ in replies] == [500, 552, 555, 250, 250, 354, 552, 250]
    assert sink.messages == []
    assert "STARTTLS" not in sink.transcript


async def test_smtp_starttls_discards_pipelined_plaintext(
    smtp_sink: SmtpSink, tls_ca: TlsAuthority
) -> None:
    async def read_reply(stream: trio.abc.Stream) -> bytes:
        data = b""
        while not data.endswith(b"\r\n"):
            data += await stream.receive_some(4096)
        return data

    async with await trio.open_tcp_stream(smtp_sink.host, smtp_sink.port) as raw:
        await read_reply(raw)  # greeting
        await raw.send_all(b"EHLO x\r\n")
        await read_reply(raw)
        await raw.send_all(b"STARTTLS\r\nNOOP injected\r\n")  # injection attempt
        assert (await read_reply(raw)).startswith(b"220 ")
        tls = trio.SSLStream(raw, tls_ca.client_context(), server_hostname="127.0.0.1")
        await tls.do_handshake()
        await tls.send_all(b"NOOP after\r\n")
        assert (await read_reply(tls)).startswith(b"250 ")
        await tls.aclose()

    assert smtp_sink.transcript == ["EHLO x", "STARTTLS", "NOOP after"]


async def test_smtp_wait_for_messages_times_out(smtp_sink: SmtpSink) -> None:
    with pytest.raises(trio.TooSlowError):
        await smtp_sink.wait_for_messages(1, timeout=0.05)


# -- HTTPS -------------------------------------------------------------------------------


def https_client(tls_ca: TlsAuthority) -> httpx.AsyncClient:
    return httpx.AsyncClient(verify=tls_ca.client_context(), timeout=30)


async def test_https_records_request_and_answers_default(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    async with https_client(tls_ca) as client:
        response = await client.post(
            f"{https_receiver.url}/hooks/1?attempt=2",
            json={"event": "delivered"},
            headers={"X-Postroom-Signature": "abc"},
        )

    assert response.status_code == 200
    assert response.json() == {}
    (request,) = await https_receiver.wait_for_requests(1)
    assert request.method == "POST"
    assert request.path == "/hooks/1?attempt=2"
    assert request.headers["x-postroom-signature"] == "abc"
    assert request.headers["content-type"] == "application/json"
    assert request.json() == {"event": "delivered"}


async def test_https_status_sequence_on_one_connection(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    https_receiver.respond_sequence([500, HttpReply(502, b'{"e": 1}'), 200])
    https_receiver.respond(410, '{"gone": true}', headers={"Retry-After": "7"})

    async with https_client(tls_ca) as client:
        responses = [await client.post(https_receiver.url, content=b"x") for _ in range(4)]

    assert [r.status_code for r in responses] == [500, 502, 200, 410]
    assert responses[1].content == b'{"e": 1}'
    assert responses[3].json() == {"gone": True}
    assert responses[3].headers["retry-after"] == "7"
    assert https_receiver.connections == 1  # keep-alive
    assert [r.body for r in https_receiver.requests] == [b"x"] * 4


async def test_https_delay_runs_in_virtual_time(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority, autojump_clock: trio.abc.Clock
) -> None:
    https_receiver.respond(200, delay=600)
    started_virtual, started_real = trio.current_time(), time.monotonic()

    async with httpx.AsyncClient(verify=tls_ca.client_context(), timeout=3600) as client:
        response = await client.get(https_receiver.url)

    assert response.status_code == 200
    assert trio.current_time() - started_virtual >= 600
    assert time.monotonic() - started_real < 5


async def test_https_refuses_oversized_body(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    async with https_client(tls_ca) as client:
        too_big = await client.post(https_receiver.url, content=b"z" * (MAX_BODY + 1))
        fine = await client.post(https_receiver.url, content=b"small")

    assert too_big.status_code == 413
    assert fine.status_code == 200
    assert [r.body for r in https_receiver.requests] == [b"small"]


async def test_https_survives_client_rejecting_certificate(
    https_receiver: HttpsReceiver, tls_ca: TlsAuthority
) -> None:
    async with httpx.AsyncClient(verify=ssl.create_default_context()) as untrusting:
        with pytest.raises(httpx.ConnectError):
            await untrusting.get(https_receiver.url)
    async with https_client(tls_ca) as client:
        assert (await client.get(f"https://localhost:{https_receiver.port}/")).status_code == 200


def test_tls_ca_file_holds_the_ca(tls_ca: TlsAuthority) -> None:
    assert tls_ca.ca_file.read_bytes() == tls_ca.ca_pem
    assert tls_ca.ca_pem.startswith(b"-----BEGIN CERTIFICATE-----")
