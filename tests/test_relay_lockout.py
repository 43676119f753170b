"""A few hosts cannot lock everyone else out of SMTP: raw sockets and smtplib against the
real submission and inbound listeners.

Idle connections from many addresses leave places for a new client and are dropped after
the idle time; talk that moves no mail (NOOP) cannot keep a session open; IPv6 clients are
counted per /64; failed SMTP AUTH is limited per username and per client address, in the
database, and a reached limit refuses even the right password (454).
"""

from __future__ import annotations

import smtplib
from functools import partial
from typing import Any, cast

import pytest
import trio
from trio.testing import MockClock

from engine.accounts.login_limits import RELAY_ADDRESS, RELAY_USERNAME, client_group
from engine.platform.runtime import Runtime
from engine.smtp.server import MAX_JUNK, ServerPolicy
from relay.connection import Timeouts
from relay.inbound import InboundSession
from relay.listener import MAX_CONNECTIONS, MAX_PER_CLIENT, SmtpListener
from tests.harness.dns_server import DnsServer
from tests.harness.relay import mime, relay_account, reply_line, submit
from tests.harness.service import Service
from tests.harness.tls import TlsAuthority


async def _closed(stream: trio.SocketStream) -> bool:
    with trio.fail_after(10):
        return await stream.receive_some() == b""


async def test_idle_hosts_holding_every_place_leave_room_for_a_new_client(
    service: Service, clock: MockClock
) -> None:
    host, port = service.inbound_address
    held: list[trio.SocketStream] = []
    refused = 0
    try:
        # 25 hosts try to hold 20 idle connections each: the whole listener.
        for n in range(2, 27):
            for _ in range(MAX_PER_CLIENT):
                stream = await trio.open_tcp_stream(host, port, local_address=f"127.0.0.{n}")
                if (await reply_line(stream)).startswith(b"220 "):
                    held.append(stream)
                else:
                    refused += 1
                    await stream.aclose()
        assert len(held) + refused == MAX_CONNECTIONS
        assert refused > 0  # the last places are kept for clients holding none

        newcomer = await trio.open_tcp_stream(host, port)
        assert (await reply_line(newcomer)).startswith(b"220 ")
        await newcomer.send_all(b"HELO client.example\r\n")
        assert (await reply_line(newcomer)).startswith(b"250 ")
        await newcomer.aclose()

        # Idle sessions do not keep their places: past the idle time (shorter under stress)
        # every one is told 421 and closed.
        clock.jump(Timeouts().idle + 1)
        for stream in held[:: len(held) // 10]:
            assert (await reply_line(stream)).startswith(b"421 4.4.2")
            assert await _closed(stream)
    finally:
        for stream in held:
            await stream.aclose()


@pytest.mark.parametrize("command", [b"NOOP", b"RSET", b"XYZZY"])
async def test_talk_that_moves_no_mail_cannot_keep_a_session_open(
    service: Service, command: bytes
) -> None:
    stream = await trio.open_tcp_stream(*service.inbound_address)
    try:
        sent = 0
        while b"421 " not in (reply := await reply_line(stream)):
            assert sent <= MAX_JUNK
            await stream.send_all(command + b"\r\n")
            sent += 1
        assert b"421 4.7.0 Too many " in reply  # commands (NOOP, RSET) or errors (XYZZY)
        assert await _closed(stream)
    finally:
        await stream.aclose()


async def test_an_idle_session_before_any_mail_is_dropped_after_the_idle_time(
    service: Service, clock: MockClock
) -> None:
    stream = await trio.open_tcp_stream(*service.inbound_address)
    try:
        assert (await reply_line(stream)).startswith(b"220 ")
        await stream.send_all(b"HELO client.example\r\n")
        assert (await reply_line(stream)).startswith(b"250 ")
        await trio.testing.wait_all_tasks_blocked()
        clock.jump(Timeouts().idle + 1)
        assert (await reply_line(stream)).startswith(b"421 4.4.2")
        assert await _closed(stream)
    finally:
        await stream.aclose()


# -- IPv6 clients are counted per /64 --------------------------------------------------------


@pytest.mark.parametrize(
    ("address", "group"),
    [
        ("2001:db8:1:2:aaaa::1", "2001:db8:1:2::/64"),
        ("2001:db8:1:2:ffff:ffff:ffff:ffff", "2001:db8:1:2::/64"),
        ("2001:db8:1:3::1", "2001:db8:1:3::/64"),
        ("::ffff:127.0.0.2", "127.0.0.2"),
        ("192.0.2.7", "192.0.2.7"),
        ("::1", "::/64"),
    ],
)
def test_client_addresses_are_grouped_per_ipv6_64(address: str, group: str) -> None:
    assert client_group(address) == group


async def test_the_listener_counts_ipv6_clients_per_64(nursery: trio.Nursery) -> None:
    policy = ServerPolicy("relay.test", max_message_size=1000, tls_available=False)
    listener = SmtpListener(
        "test",
        ("::1", 0),
        policy,
        lambda client: InboundSession(cast(Runtime, None), "127.0.0.1"),
        tls=None,
        max_per_client=2,
    )
    host, port = await nursery.start(listener.run)
    held = [await trio.open_tcp_stream(host, port) for _ in range(2)]
    for stream in held:
        assert (await reply_line(stream)).startswith(b"220 ")
    extra = await trio.open_tcp_stream(host, port)
    assert (await reply_line(extra)).startswith(b"421 4.7.0 Too many connections from your address")
    assert listener.statistics().connections_refused_per_client == 1
    for stream in [*held, extra]:
        await stream.aclose()
    listener.stop()


# -- Failed SMTP AUTH is limited per username and per client address ---------------------------


def _auth_code(service: Service, tls_ca: TlsAuthority, username: str, password: str) -> int:
    """The reply code to AUTH PLAIN over a fresh connection (blocking: run in a thread)."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.ehlo()
        smtp.user, smtp.password = username, password
        try:
            smtp.auth("PLAIN", smtp.auth_plain)
        except smtplib.SMTPAuthenticationError as refused:
            return refused.smtp_code
        return 235


async def test_wrong_passwords_for_one_username_lock_it_for_a_while(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority, clock: MockClock
) -> None:
    _, credential = await relay_account(service, dns_server)
    user, right = credential["username"], credential["password"]
    for _ in range(RELAY_USERNAME.attempts):
        code = await trio.to_thread.run_sync(_auth_code, service, tls_ca, user, right + "x")
        assert code == 535
    # Even the right password is refused now, without a look at it.
    assert await trio.to_thread.run_sync(_auth_code, service, tls_ca, user, right) == 454
    clock.jump(RELAY_USERNAME.window.total_seconds() + 1)
    assert await trio.to_thread.run_sync(_auth_code, service, tls_ca, user, right) == 235
    refused = await trio.to_thread.run_sync(
        partial(submit, service, tls_ca, credential, ["ann@customer.example"], mime("Back"))
    )
    assert refused == {}


async def test_wrong_passwords_over_many_usernames_lock_the_client_address(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    _, credential = await relay_account(service, dns_server)
    domain = credential["username"].partition("@")[2]
    for n in range(RELAY_ADDRESS.attempts):
        code = await trio.to_thread.run_sync(
            _auth_code, service, tls_ca, f"guess{n}@{domain}", "secret"
        )
        assert code == 535
    answer: Any = await trio.to_thread.run_sync(
        _auth_code, service, tls_ca, credential["username"], credential["password"]
    )
    assert answer == 454
