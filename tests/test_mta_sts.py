"""MTA-STS on the way out (RFC 8461, issue 31): the policy fetched over verified HTTPS from a
real policy server on loopback, cached in the database, and what `enforce` and `testing` do
with a real SMTP sink whose certificate does or does not match the MX name."""

from __future__ import annotations

import pytest

from engine.delivery import mta_sts
from engine.delivery.messages import WireMessage
from tests.harness import tls_policies
from tests.harness.sending import ready_account
from tests.harness.tls_policies import (
    DOMAIN,
    Loopback,
    delivered_without_policy,
    events_of,
    is_delivered,
    send_until,
    sts_policy,
    tls_counts,
    was_deferred,
)

# The peers of tests/harness/tls_policies.py (a DNS server, an HTTPS policy server, the test CA).
loopback = tls_policies.loopback
policy_server = tls_policies.policy_server

POLICY_PATH = "/.well-known/mta-sts.txt"


async def test_enforce_delivers_over_verified_tls_and_fetches_the_policy_once(
    loopback: Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink(f"mx.{DOMAIN}")
    loopback.publish(DOMAIN, "20261126", 200, sts_policy("enforce", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        delivered = []
        for n in range(3):  # one after the other: each a round of its own, the cache shared
            done = await send_until(account, f"u{n}@{DOMAIN}", is_delivered)
            delivered += events_of(done, "delivered")
        assert len(sink.messages) == 3 and all(m.tls for m in sink.messages)
        for event in delivered:
            assert event["policy"] == "mta-sts"
            assert event["mx_host"] == f"mx.{DOMAIN}"
            assert event["tls"]["verified"] is True
        [fetch] = policy_server.requests  # one fetch for every delivery
        assert fetch.method == "GET" and fetch.path == POLICY_PATH
        assert fetch.headers["host"] == f"mta-sts.{DOMAIN}:{policy_server.port}"
        counts = await tls_counts(service)
        assert counts[("mta-sts", "verified")] == 3
        assert counts[("opportunistic", "encrypted")] == 0


async def test_enforce_defers_for_a_wrong_certificate_or_an_unlisted_mx_never_in_plain_text(
    loopback: Loopback,
) -> None:
    dns_server = loopback.dns
    # The sink's certificate names the loopback addresses, not the MX host.
    sink = await loopback.sink("localhost", "127.0.0.1")
    # One policy for both: it lists only mx.customer.example.
    listing = sts_policy("enforce", f"mx.{DOMAIN}", "*.elsewhere.example")
    for domain in (DOMAIN, "unlisted.example"):
        loopback.publish(domain, "1", 200, listing)
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        reasons = {}
        for domain in (DOMAIN, "unlisted.example"):
            done = await send_until(account, f"ann@{domain}", was_deferred)
            [deferred, *_] = events_of(done, "deferred")
            assert deferred["policy"] == "mta-sts" and deferred["reason"] == "tls_policy"
            reasons[domain] = deferred["response"]
        assert "certificate verify failed" in reasons[DOMAIN]
        assert "mx.unlisted.example is not listed" in reasons["unlisted.example"]
        assert sink.messages == []  # never fell back to plain text
        assert not any(line.startswith("MAIL") for line in sink.transcript)


async def test_tls_required_no_delivers_where_the_policy_passes_every_host_over(
    loopback: Loopback,
) -> None:
    """RFC 8689 5: a sender who sets `TLS-Required: No` (say, to tell a domain's postmaster
    that its MTA-STS is broken) has the message delivered all the same, with opportunistic
    TLS; the same message without it waits for the policy to be met."""
    dns_server = loopback.dns
    sink = await loopback.sink("localhost", "127.0.0.1")  # not the MX name: enforce refuses
    loopback.publish(DOMAIN, "1", 200, sts_policy("enforce", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        first = await send_until(account, f"ann@{DOMAIN}", was_deferred)
        assert events_of(first, "deferred")[0]["reason"] == "tls_policy"
        received = await delivered_without_policy(account, sink, f"bob@{DOMAIN}")
        assert b"\r\nTLS-Required: No\r\n" in received
        # The other one still waits for the policy to be met.
        waiting = (await account.client.get(f"/v1/emails/{first['id']}")).json()
        assert waiting["status"] != "delivered" and not events_of(waiting, "delivered")


def test_tls_required_is_read_from_the_header_as_rfc_8689_writes_it() -> None:
    def asks(header: bytes) -> bool:
        data = b"From: a@example.org\r\n" + header + b"Subject: x\r\n\r\nTLS-Required: No\r\n"
        return WireMessage("id", "a@example.org", data).asks_no_tls_policy()

    assert asks(b"TLS-Required: No\r\n")
    assert asks(b"tls-required:no\r\n")
    assert asks(b"TLS-Required:\r\n No\r\n")  # folded
    assert not asks(b"TLS-Required: Yes\r\n")
    assert not asks(b"TLS-Required: No thanks\r\n")
    assert not asks(b"X-TLS-Required: No\r\n")
    assert not asks(b"")  # in the body only


async def test_testing_delivers_and_records_and_a_new_id_is_fetched_and_enforced(
    loopback: Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink()  # offers no STARTTLS
    loopback.publish(DOMAIN, "a1", 200, sts_policy("testing", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        done = await send_until(account, f"ann@{DOMAIN}", is_delivered)
        [delivered] = events_of(done, "delivered")
        assert delivered["policy"] == "mta-sts" and delivered["tls"] is None
        assert (await tls_counts(service))[("mta-sts", "plaintext")] == 1

        # The domain publishes a new id: the policy is fetched again, and now it enforces.
        dns_server.set(f"_mta-sts.{DOMAIN}", "TXT", ["v=STSv1; id=b2"])
        policy_server.respond(200, sts_policy("enforce", f"mx.{DOMAIN}"))
        done = await send_until(account, f"bob@{DOMAIN}", was_deferred)
        [deferred, *_] = events_of(done, "deferred")
        assert deferred["reason"] == "tls_policy" and "did not start TLS" in deferred["response"]
        assert len(policy_server.requests) == 2 and len(sink.messages) == 1


async def test_testing_takes_up_again_the_connection_it_delivered_over_unverified(
    loopback: Loopback,
) -> None:
    """In testing mode a host whose certificate does not verify gets the mail all the same, and
    the connection goes back to the pool: the next round takes it rather than failing the
    verification again and opening another."""
    dns_server = loopback.dns
    sink = await loopback.sink(f"other.{DOMAIN}")  # a certificate for another name
    loopback.publish(DOMAIN, "t1", 200, sts_policy("testing", f"mx.{DOMAIN}"))
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        opened = []
        for n in range(2):  # one after the other: each a round of its own
            done = await send_until(account, f"u{n}@{DOMAIN}", is_delivered)
            [delivered] = events_of(done, "delivered")
            assert delivered["policy"] == "mta-sts" and delivered["tls"]["verified"] is False
            await service.settled()  # its outcome written: the connection is back in the pool
            opened.append(sink.connections)
        assert opened[1] == opened[0]  # the second round opened nothing
        assert len(sink.messages) == 2


async def test_a_failed_fetch_is_no_policy_and_is_not_tried_again_at_once(
    loopback: Loopback,
) -> None:
    dns_server, policy_server = loopback.dns, loopback.policy_server
    sink = await loopback.sink(f"mx.{DOMAIN}")
    loopback.publish(DOMAIN, "1", 404, "no policy here")
    async with loopback.service(sink) as service:
        account = await ready_account(service, dns_server)
        for n in range(2):
            done = await send_until(account, f"u{n}@{DOMAIN}", is_delivered)
            [delivered] = events_of(done, "delivered")
            assert delivered["policy"] == "opportunistic"
            assert delivered["tls"]["verified"] is False
        assert len(policy_server.requests) == 1  # the next try waits for FETCH_AGAIN


def test_policy_records_and_files_are_read_as_rfc_8461_says() -> None:
    assert mta_sts.txt_id(["v=STSv1; id=20160831085700Z;"]) == "20160831085700Z"
    assert mta_sts.txt_id(["v=STSv1; id=a", "v=STSv1; id=b"]) is None  # two: none usable
    assert mta_sts.txt_id(["v=spf1 -all"]) is None
    assert mta_sts.txt_id(["v=STSv1; id=not-alnum"]) is None
    mode, mx, age = mta_sts.parse(
        sts_policy("enforce", "mail.example.com", "*.example.net", max_age=10**9)
    )
    assert (mode, mx, age) == ("enforce", ("mail.example.com", "*.example.net"), 31_557_600)
    policy = mta_sts.Policy("example.com", "1", mode, mx)
    assert policy.allows("MAIL.example.com.") and policy.allows("a.example.net")
    assert not policy.allows("a.b.example.net") and not policy.allows("example.net")
    for bad, why in [
        ("version: STSv2\nmode: enforce\nmx: a.example\nmax_age: 1\n", "version"),
        ("version: STSv1\nmode: strict\nmx: a.example\nmax_age: 1\n", "mode"),
        ("version: STSv1\nmode: enforce\nmax_age: 1\n", "lists no mx"),
        ("version: STSv1\nmode: enforce\nmx: a.example\nmax_age: -1\n", "max_age"),
        ("version: STSv1\nmode: enforce\nmx: bad host!\nmax_age: 1\n", "host name pattern"),
    ]:
        with pytest.raises(ValueError, match=why):
            mta_sts.parse(bad)
