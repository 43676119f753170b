"""Bounces read by what they say (RFC 3463), on both engines against the SMTP sink answering
as real providers do: only a recipient that is gone is bounced and suppressed; a full mailbox
is tried again on the schedule and suppressed only after it stays full for days; a refused
message, a protocol error and a policy fail that email and leave the address deliverable;
`dsn` carries the enhanced status code; an asynchronous DSN is read the same way."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from trio.testing import MockClock

from engine.delivery.bounces import SOFT_BOUNCE_LIMIT, Tally, tally
from tests.harness.bounce_domain import postfix_dsn
from tests.harness.dns_server import DnsServer
from tests.harness.inbound import send_inbound
from tests.harness.sending import (
    message,
    ready_account,
    route_mail,
    wait_for_email,
    wait_for_status,
)
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink

GMAIL_FULL = (
    "5.2.2 The recipient's inbox is out of storage space and inactive. Please direct the"
    " recipient to https://support.google.com/mail/?p=OverQuotaPerm"
)
# address -> (the sink's RCPT reply, the recipient's status, its last event, suppressed, dsn)
REPLIES: dict[str, tuple[int, str, str, str, bool, str]] = {
    "gone": (
        550,
        "5.1.1 The email account that you tried to reach does not exist.",
        "bounced",
        "bounced",
        True,
        "5.1.1",
    ),
    "dbeb": (
        550,
        "5.4.1 Recipient address rejected: Access denied. AS(201806281)",
        "bounced",
        "bounced",
        True,
        "5.4.1",
    ),
    "gfull": (552, GMAIL_FULL, "deferred", "deferred", False, "5.2.2"),
    "msfull": (
        554,
        "5.2.2 mailbox full; STOREDRV.Deliver.Exception:QuotaExceededException",
        "deferred",
        "deferred",
        False,
        "5.2.2",
    ),
    "big": (552, "5.3.4 Message size exceeds fixed maximum message size", "failed", "failed", False, "5.3.4"),
    "content": (554, "5.6.0 Message refused: content rejected", "failed", "failed", False, "5.6.0"),
    "syntax": (500, "5.5.2 Syntax error, command unrecognized", "failed", "failed", False, "5.5.2"),
    "group": (
        550,
        "5.7.1 RESOLVER.RST.AuthRequired; authentication required",
        "failed",
        "failed",
        False,
        "5.7.1",
    ),
}  # fmt: skip


async def _suppressed(account: Account) -> dict[str, str]:
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    return {s["email"]: s["reason"] for s in listed}


async def test_only_a_recipient_that_is_gone_is_bounced_and_suppressed(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "people.example")
    sent = {}
    for local, (code, text, *_) in REPLIES.items():
        address = f"{local}@people.example"
        smtp_sink.reply_for(address, code, text)
        sent[local] = (await account.client.post("/v1/emails/", json=message(address))).json()["id"]

    for local, (_, text, status, kind, _, dsn) in REPLIES.items():
        email = await wait_for_status(account, sent[local], (status,))
        last = email["events"][-1]
        assert last["event_type"] == kind, local
        assert last["metadata"]["dsn"] == dsn, local
        assert text in last["metadata"]["response"], local
        if kind == "deferred":  # a full mailbox: a soft bounce, tried again on the schedule
            assert last["metadata"]["bounce_type"] == "soft"
            assert last["metadata"]["next_attempt_at"]
        if kind == "bounced":
            assert last["metadata"]["bounce_type"] == "hard"
    gone = {f"{local}@people.example" for local, reply in REPLIES.items() if reply[4]}
    assert await _suppressed(account) == dict.fromkeys(gone, "hard_bounce")


async def test_a_mailbox_full_for_days_is_suppressed_after_the_limit(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "full.example")
    smtp_sink.reply_for("ann@full.example", 552, GMAIL_FULL)
    sent = (await account.client.post("/v1/emails/", json=message("ann@full.example"))).json()
    email = await wait_for_status(account, sent["id"], ("deferred",))

    def attempts(email: dict[str, Any]) -> int:
        return sum(e["event_type"] in ("deferred", "bounced") for e in email["events"])

    # Each jump lets one more retry happen (the schedule reaches 8 hours apart).
    while email["status"] == "deferred":
        assert await _suppressed(account) == {}
        before = attempts(email)

        def retried(email: dict[str, Any], before: int = before) -> bool:
            return attempts(email) > before

        clock.jump(8 * 3600)
        email = await wait_for_email(account, sent["id"], retried)
    assert email["status"] == "bounced"
    bounced = email["events"][-1]
    assert bounced["event_type"] == "bounced"
    assert bounced["metadata"]["mailbox_full"]["count"] == SOFT_BOUNCE_LIMIT
    assert bounced["metadata"]["dsn"] == "5.2.2"
    since = datetime.fromisoformat(bounced["metadata"]["mailbox_full"]["since"])
    assert datetime.fromisoformat(bounced["created_at"]) - since >= timedelta(hours=48)
    assert await _suppressed(account) == {"ann@full.example": "hard_bounce"}


async def test_an_asynchronous_dsn_is_read_like_a_reply(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "relay.example")
    gone, full, big = "gone@relay.example", "full@relay.example", "big@relay.example"
    sent = (await account.client.post("/v1/emails/", json=message([gone, full, big]))).json()
    [received] = await smtp_sink.wait_for_messages(1)
    await wait_for_status(account, sent["id"], ("delivered",))
    report = postfix_dsn(
        received.mail_from,
        [
            (gone, "5.1.1", "550 5.1.1 <gone@relay.example>: Recipient address rejected: User unknown"),
            (full, "5.2.2", f"552-{GMAIL_FULL}"),
            (big, "5.3.4", "552 5.3.4 Message size exceeds fixed maximum message size"),
        ],
    )  # fmt: skip
    assert await send_inbound(service, [received.mail_from], report, sender="") == set()

    def settled(email: dict[str, Any]) -> bool:
        return not any(r["status"] == "delivered" for r in email["recipients"])

    email = await wait_for_email(account, sent["id"], settled)
    statuses = {r["address"]: r["status"] for r in email["recipients"]}
    assert statuses == {gone: "bounced", full: "failed", big: "failed"}
    events = {
        e["recipient"]: e for e in email["events"] if e["event_type"] in ("bounced", "failed")
    }
    assert events[gone]["metadata"]["dsn"] == "5.1.1"
    assert (events[full]["metadata"]["bounce_type"], events[full]["metadata"]["dsn"]) == (
        "soft",
        "5.2.2",
    )
    assert (events[big]["metadata"]["blame"], events[big]["metadata"]["dsn"]) == (
        "message",
        "5.3.4",
    )
    assert await _suppressed(account) == {gone: "hard_bounce"}


def test_a_full_mailbox_counts_once_a_day_within_two_weeks() -> None:
    start = datetime(2026, 1, 1, tzinfo=UTC)
    first = tally(None, start)
    assert tally(first, start + timedelta(hours=23)) == first  # one retry series
    second = tally(first, start + timedelta(hours=25))
    assert (second.count, second.exhausted) == (2, False)
    third = tally(second, start + timedelta(hours=50))
    assert (third.count, third.exhausted) == (3, True)
    assert tally(second, start + timedelta(days=15)) == Tally(
        1, start + timedelta(days=15), start + timedelta(days=15)
    )
