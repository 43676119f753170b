"""A stranger cannot fill memory through the MX: smtplib against the real inbound listener.

A message whose structure would make a parser blow up (20,000 header fields, MIME nested
2,000 deep, thousands of parts) is refused with 554 5.6.0 naming the bound, before anything
parses it; a message that finds the process's message memory full waits its turn, or is
told 452 4.3.1 (the client keeps it and retries); large messages are spooled to disk while
they arrive, and reach their destination intact.
"""

from __future__ import annotations

import smtplib
from typing import cast

import pytest
import trio
from trio.testing import MockClock

from engine.mail.structure import MAX_HEADER_FIELDS, MAX_MIME_DEPTH, MAX_MIME_PARTS
from engine.platform.message_memory import LIMIT, MessageMemory
from relay.connection import MEMORY_WAIT, READING
from relay.spool import SPOOL_AT
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import DESTINATION, SOURCE, forwarding_account, rule
from tests.harness.sending import route_mail
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink

HEAD = f"From: Alice <alice@sender.example>\r\nTo: {SOURCE}\r\nSubject: Hi\r\n".encode()


def _deliver(address: tuple[str, int], data: bytes) -> tuple[int, bytes]:
    """Send `data` to SOURCE over the MX (blocking: run in a thread); the final reply."""
    with smtplib.SMTP(*address, timeout=60) as client:
        try:
            client.sendmail("alice@sender.example", [SOURCE], data)
        except smtplib.SMTPDataError as refused:
            return refused.smtp_code, cast(bytes, refused.smtp_error)
        return 250, b""


async def _forwarding(service: Service, dns_server: DnsServer) -> None:
    account, domain = await forwarding_account(service, dns_server)
    created = await account.client.post("/v1/forwards/", json=rule(domain))
    assert created.status_code == 201


def _many_fields() -> bytes:
    return HEAD + b"".join(b"X-Field-%d: v\r\n" % n for n in range(20_000)) + b"\r\nHi\r\n"


def _deep_mime() -> bytes:
    nest = b"".join(
        b"--b%d\r\nContent-Type: multipart/mixed; boundary=b%d\r\n\r\n" % (n, n + 1)
        for n in range(2_000)
    )
    return HEAD + b"Content-Type: multipart/mixed; boundary=b0\r\n\r\n" + nest + b"x\r\n"


def _many_parts() -> bytes:
    parts = b"--b\r\nContent-Type: text/plain\r\n\r\nx\r\n" * 5_000
    return HEAD + b"Content-Type: multipart/mixed; boundary=b\r\n\r\n" + parts + b"--b--\r\n"


async def _until_waiting(memory: MessageMemory) -> None:
    """Until a session waits for room in the budget (it runs in another thread's client)."""
    with trio.fail_after(30):
        while not memory.statistics().waiting:  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.01)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (_many_fields, f"more than {MAX_HEADER_FIELDS} header fields"),
        (_deep_mime, f"nest more than {MAX_MIME_DEPTH} deep"),
        (_many_parts, f"more than {MAX_MIME_PARTS} MIME parts"),
    ],
)
async def test_a_message_past_a_structure_bound_is_refused_naming_it(
    service: Service, dns_server: DnsServer, build: object, named: str
) -> None:
    await _forwarding(service, dns_server)
    data = build()  # type: ignore[operator]
    code, text = await trio.to_thread.run_sync(_deliver, service.inbound_address, data)
    assert code == 554
    assert text.startswith(b"5.6.0 ") and named.encode() in text
    metrics = (await service.client().get("/metrics")).text
    assert "postroom_inbound_messages_refused 1.0" in metrics


async def test_a_message_waits_for_memory_and_is_told_452_when_none_comes_free(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    await _forwarding(service, dns_server)
    route_mail(dns_server, DESTINATION.partition("@")[2])
    memory = service.running.runtime.message_memory
    # Other work holds the budget but for what one session needs to read a message.
    held = LIMIT - READING
    await memory.acquire(held)
    data = HEAD + b"\r\n" + b"A line of a message that needs more than that.\r\n" * 20_000
    assert memory.cost(len(data)) > READING
    async with trio.open_nursery() as nursery:
        replies: list[tuple[int, bytes]] = []

        async def send() -> None:
            address = service.inbound_address
            replies.append(await trio.to_thread.run_sync(_deliver, address, data))

        nursery.start_soon(send)
        await _until_waiting(memory)
        clock.jump(MEMORY_WAIT + 1)
    assert replies == [(452, b"4.3.1 Insufficient system storage, try again later")]

    # With room again, the same message is taken (after a wait, when it must).
    async with trio.open_nursery() as nursery:
        nursery.start_soon(send)
        await _until_waiting(memory)
        memory.release(held)
    assert replies[-1] == (250, b"")
    await smtp_sink.wait_for_messages(1)
    assert memory.statistics().held == 0


async def test_a_large_message_is_spooled_and_forwarded_intact(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    await _forwarding(service, dns_server)
    route_mail(dns_server, DESTINATION.partition("@")[2])
    body = b"".join(
        b"line %07d of a long message\r\n.a line with a dot first\r\n" % n for n in range(20_000)
    )
    data = HEAD + b"\r\n" + body
    assert len(data) > 4 * SPOOL_AT
    code, _ = await trio.to_thread.run_sync(_deliver, service.inbound_address, data)
    assert code == 250
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.data.endswith(body)  # dots stuffed and unstuffed at every hop
    memory = service.running.runtime.message_memory
    with trio.fail_after(10):  # the delivery round gives its share back with its outcome
        while memory.statistics().held:  # noqa: ASYNC110 - no event to wait on
            await trio.sleep(0.01)
