"""Sending end to end: API accept, MX lookup, SMTP to the sink, DKIM, retries, bounces."""

from __future__ import annotations

import base64
from datetime import UTC, datetime, timedelta

import trio
from trio.testing import MockClock

from engine.sending import statuses
from engine.sending.email_log import UPDATES_SETTLE
from engine.sending.statuses import Trigger
from storage import emails
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.domains import add_domain
from tests.harness.sending import (
    SENDER,
    SENDING_DOMAIN,
    dkim_verifies,
    message,
    ready_account,
    route_mail,
    wait_for_email,
    wait_for_status,
)
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink


async def test_sent_email_arrives_signed_and_is_delivered(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "customer.example")
    response = await account.client.post(
        "/v1/emails/", json=message("ann@customer.example", tags=["receipt"])
    )
    assert response.status_code == 202
    sent = response.json()
    assert sent["status"] == "queued"
    assert sent["rejection_reason"] is None
    assert sent["message_id"].endswith(f"@{SENDING_DOMAIN}>")

    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == ("ann@customer.example",)
    assert received.mail_from.startswith("bounces+") and received.mail_from.endswith(
        f"@{SENDING_DOMAIN}"
    )
    assert received.tls  # opportunistic STARTTLS was offered and taken
    assert await trio.to_thread.run_sync(dkim_verifies, received.data, dns_server)
    assert sent["message_id"].encode() in received.data

    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "delivered"
    assert email["delivered_at"] is not None
    types = [e["event_type"] for e in email["events"]]
    assert types == ["queued", "sent", "delivered"]
    delivered = email["events"][-1]
    assert delivered["metadata"]["domain"] == "customer.example"
    assert delivered["metadata"]["smtp_response"].startswith("250")


async def test_recipients_on_several_domains_are_delivered_per_domain(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    for domain in ("one.example", "two.example"):
        route_mail(dns_server, domain)
    body = message(
        ["a@one.example", "b@two.example"],
        cc=[{"email": "c@one.example"}],
        bcc=[{"email": "d@two.example"}],
    )
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    received = await smtp_sink.wait_for_messages(2)
    by_rcpts = sorted(tuple(sorted(m.rcpt_to)) for m in received)
    assert by_rcpts == [("a@one.example", "c@one.example"), ("b@two.example", "d@two.example")]
    assert all(b"d@two.example" not in m.data for m in received)  # bcc stays off the headers
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"


async def test_temporary_failure_is_retried_until_delivered(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "slow.example")
    smtp_sink.fail_first("bob@slow.example", 2, code=451)
    sent = (await account.client.post("/v1/emails/", json=message("bob@slow.example"))).json()
    deferred = await wait_for_status(account, sent["id"], ("deferred",))
    assert deferred["recipients"][0]["attempts"] == 1
    clock.jump(61)  # first back-off step: 1 minute
    await wait_for_status(account, sent["id"], ("deferred",))
    await wait_for_email(account, sent["id"], lambda email: email["recipients"][0]["attempts"] == 2)
    clock.jump(5 * 60 + 1)  # second step: 5 minutes
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "delivered"
    assert [e["event_type"] for e in email["events"]].count("deferred") == 2
    assert len(smtp_sink.messages) == 1


async def test_temporary_failures_for_72_hours_fail_the_recipient(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "down.example")
    sent = (await account.client.post("/v1/emails/", json=message("tempfail@down.example"))).json()
    await wait_for_status(account, sent["id"], ("deferred",))
    for _ in range(40):
        clock.jump(8 * 3600)
        await service.settled()
        email = (await account.client.get(f"/v1/emails/{sent['id']}")).json()
        if email["status"] == "failed":
            break
    assert email["status"] == "failed"
    assert email["events"][-1]["event_type"] == "failed"


async def test_permanent_failure_bounces_and_suppresses(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "gone.example")
    sent = (await account.client.post("/v1/emails/", json=message("permfail@gone.example"))).json()
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "bounced"
    bounced = email["events"][-1]
    assert bounced["event_type"] == "bounced"
    assert bounced["metadata"]["bounce_type"] == "hard"
    assert bounced["metadata"]["response"].startswith("550")
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert [(s["email"], s["reason"], s["source_email_id"]) for s in listed] == [
        ("permfail@gone.example", "hard_bounce", sent["id"])
    ]


async def test_suppression_override_sequence(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "blocked.example")
    await account.client.post("/v1/suppressions/", json={"email": "zoe@blocked.example"})

    first = await account.client.post("/v1/emails/", json=message("zoe@blocked.example"))
    assert first.status_code == 202
    assert first.json()["status"] == "rejected"
    assert "suppressed" in first.json()["rejection_reason"]

    # Validation never counts as an attempt.
    checked = (
        await account.client.post("/v1/emails/validate", json=message("zoe@blocked.example"))
    ).json()
    assert checked["can_send"] is True

    retried = await account.client.post(f"/v1/emails/{first.json()['id']}/retry")
    assert retried.status_code == 202
    assert retried.json()["status"] == "queued"
    await smtp_sink.wait_for_messages(1)
    assert (await wait_for_status(account, retried.json()["id"]))["retry_of_id"] == first.json()[
        "id"
    ]

    third = (await account.client.post("/v1/emails/", json=message("zoe@blocked.example"))).json()
    assert third["status"] == "rejected"

    clock.jump(25 * 3600)
    fresh = (await account.client.post("/v1/emails/", json=message("zoe@blocked.example"))).json()
    assert fresh["status"] == "rejected"  # a new first attempt, opening a new window
    again = (await account.client.post("/v1/emails/", json=message("zoe@blocked.example"))).json()
    assert again["status"] == "queued"
    await smtp_sink.wait_for_messages(2)
    assert len(smtp_sink.messages) == 2


async def test_send_refusals_have_the_spec_status_codes(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    post = account.client.post
    assert (
        await post("/v1/emails/", json=message("x@y.example", from_={"email": "no@else.example"}))
    ).status_code == 422
    assert (
        await post("/v1/emails/", json=message("x@y.example", text=None, html=None))
    ).status_code == 422
    assert (await post("/v1/emails/", json=message([]))).status_code == 422
    bad_name = [{"filename": "../etc", "content_base64": "aGk="}]
    assert (
        await post("/v1/emails/", json=message("x@y.example", attachments=bad_name))
    ).status_code == 422
    bad_base64 = [{"filename": "a.txt", "content_base64": "not base64!"}]
    assert (
        await post("/v1/emails/", json=message("x@y.example", attachments=bad_base64))
    ).status_code == 400
    huge = base64.b64encode(b"\0" * (24 * 1024 * 1024 + 1)).decode()
    too_big = [{"filename": "big.bin", "content_base64": huge}]
    assert (
        await post("/v1/emails/", json=message("x@y.example", attachments=too_big))
    ).status_code == 413
    assert (
        await post("/v1/emails/", json=message("x@y.example", send_at="2020-01-01T00:00:00Z"))
    ).status_code == 400
    injected = {"X-Ok": "fine\r\nBcc: victim@example.com"}
    assert (
        await post("/v1/emails/", json=message("x@y.example", headers=injected))
    ).status_code == 422
    structural = {"From": "ceo@example.com"}
    assert (
        await post("/v1/emails/", json=message("x@y.example", headers=structural))
    ).status_code == 422
    assert (await post("/v1/emails/00000000-0000-0000-0000-000000000000/retry")).status_code == 404
    assert len(smtp_sink.messages) == 0


async def test_free_plan_cannot_schedule(service: Service, dns_server: DnsServer) -> None:
    account = await ready_account(service, dns_server, plan="free")
    response = await account.client.post(
        "/v1/emails/", json=message("x@y.example", send_at="2099-01-01T00:00:00Z")
    )
    assert response.status_code == 403
    assert response.json()["code"] == "plan_feature"


async def test_retry_of_a_delivered_email_is_409(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "ok.example")
    sent = (await account.client.post("/v1/emails/", json=message("amy@ok.example"))).json()
    await wait_for_status(account, sent["id"])
    response = await account.client.post(f"/v1/emails/{sent['id']}/retry")
    assert response.status_code == 409


async def test_another_workspaces_email_is_404(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    other = await service.account()
    route_mail(dns_server, "ok.example")
    sent = (await account.client.post("/v1/emails/", json=message("amy@ok.example"))).json()
    assert (await other.client.get(f"/v1/emails/{sent['id']}")).status_code == 404
    assert (await other.client.get(f"/v1/emails/{sent['id']}/events")).status_code == 404
    assert (await other.client.get("/v1/emails/")).json() == []
    listed = (await account.client.get("/v1/emails/")).json()
    assert [e["id"] for e in listed] == [sent["id"]]


async def test_scheduled_email_is_sent_at_its_time(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    send_at = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    sent = (
        await account.client.post("/v1/emails/", json=message("kim@later.example", send_at=send_at))
    ).json()
    assert sent["status"] == "scheduled"
    listed = (await account.client.get("/v1/emails/scheduled")).json()
    assert [e["id"] for e in listed] == [sent["id"]]
    await service.settled()
    assert smtp_sink.messages == []
    clock.jump(2 * 3600 + 1)
    await smtp_sink.wait_for_messages(1)
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"
    assert (await account.client.get("/v1/emails/scheduled")).json() == []


async def test_cancel_and_send_now(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    send_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    first = (
        await account.client.post("/v1/emails/", json=message("a@later.example", send_at=send_at))
    ).json()
    second = (
        await account.client.post("/v1/emails/", json=message("b@later.example", send_at=send_at))
    ).json()

    cancelled = await account.client.post(f"/v1/emails/{first['id']}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json() == {"id": first["id"], "status": "cancelled"}
    assert (await account.client.post(f"/v1/emails/{first['id']}/cancel")).status_code == 404

    now = await account.client.post(f"/v1/emails/{second['id']}/send-now")
    assert now.status_code == 200
    assert now.json()["status"] == "queued"
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == ("b@later.example",)
    assert (await account.client.post(f"/v1/emails/{second['id']}/send-now")).status_code == 404

    clock.jump(2 * 86400)
    await service.settled()
    assert len(smtp_sink.messages) == 1  # the cancelled one never went out
    events = (await account.client.get(f"/v1/emails/{first['id']}/events")).json()
    assert [e["event_type"] for e in events] == ["scheduled", "cancelled"]


async def test_send_now_to_a_suppressed_recipient_is_422_and_rejects(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    send_at = (datetime.now(UTC) + timedelta(days=1)).isoformat()
    sent = (
        await account.client.post("/v1/emails/", json=message("c@later.example", send_at=send_at))
    ).json()
    await account.client.post("/v1/suppressions/", json={"email": "c@later.example"})
    refused = await account.client.post(f"/v1/emails/{sent['id']}/send-now")
    assert refused.status_code == 422
    email = (await account.client.get(f"/v1/emails/{sent['id']}")).json()
    assert email["status"] == "rejected"


async def test_search_tokens_and_free_text(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "shop.example")
    route_mail(dns_server, "club.example")
    receipt = (
        await account.client.post(
            "/v1/emails/",
            json=message("ann@shop.example", subject="Receipt 100%", tags=["receipt"]),
        )
    ).json()
    news = (
        await account.client.post(
            "/v1/emails/",
            json=message("bob@club.example", subject="Weekly news", tags=["news", "weekly"]),
        )
    ).json()
    await wait_for_status(account, receipt["id"])
    await wait_for_status(account, news["id"])

    async def ids(**params: str) -> set[str]:
        found = (await account.client.get("/v1/emails/search", params=params)).json()
        return {e["id"] for e in found}

    both = {receipt["id"], news["id"]}
    assert await ids(q="") == both
    assert await ids(q="to:shop.example") == {receipt["id"]}
    assert await ids(q="to:ANN@") == {receipt["id"]}
    assert await ids(q=f"from:{SENDER}") == both
    assert await ids(q="from:nobody") == set()
    assert await ids(q="status:delivered") == both
    assert await ids(q="status:bounced") == set()
    assert await ids(q=f"domain:{SENDING_DOMAIN}") == both
    assert await ids(q="tag:news") == {news["id"]}
    assert await ids(q="tag:new") == set()  # tags match exactly
    assert await ids(tag="receipt") == {receipt["id"]}
    assert await ids(q="weekly") == {news["id"]}
    assert await ids(q="100%") == {receipt["id"]}
    assert await ids(q="receipt to:club.example") == set()  # every part applies
    assert await ids(status="delivered", q="club") == {news["id"]}


async def test_updates_feed_returns_changes_after_a_time(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "feed.example")
    sent = (await account.client.post("/v1/emails/", json=message("f@feed.example"))).json()
    email = await wait_for_status(account, sent["id"])
    clock.jump(UPDATES_SETTLE.total_seconds())  # the feed shows settled changes
    feed = (
        await account.client.get("/v1/emails/updates", params={"since": "2000-01-01T00:00:00Z"})
    ).json()
    assert [e["id"] for e in feed] == [sent["id"]]
    assert feed[0]["status"] == "delivered"
    later = (
        await account.client.get("/v1/emails/updates", params={"since": email["delivered_at"]})
    ).json()
    assert later == []
    assert (await account.client.get("/v1/emails/updates")).status_code == 422
    assert (
        await account.client.get("/v1/emails/updates", params={"since": "yesterday"})
    ).status_code == 422


async def test_the_updates_feed_pages_through_every_change(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    """A client goes on from each page's `X-Next-Since` (its last change's time). A batch's
    emails share their change time, so a page that would end inside such a group takes the
    rest of it: else the next `since` would skip them."""
    account = await ready_account(service, dns_server, plan="business")
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()

    async def singles(count: int) -> list[str]:
        ids = []
        for i in range(count):
            body = message(f"s{i}@feed.example", send_at=later)
            ids.append((await account.client.post("/v1/emails/", json=body)).json()["id"])
        return ids

    async def page(since: str) -> tuple[list[str], str]:
        """A page's email ids, and the `since` of the next."""
        got = await account.client.get("/v1/emails/updates", params={"since": since})
        assert got.status_code == 200, got.text
        return [e["id"] for e in got.json()], got.headers["X-Next-Since"]

    first_singles = await singles(45)
    batch = [message(f"b{i}@feed.example", send_at=later) for i in range(30)]
    response = await account.client.post("/v1/emails/batch", json=batch)
    assert response.status_code == 202, response.text
    batched = [r["id"] for r in response.json()]
    clock.jump(UPDATES_SETTLE.total_seconds())
    ids, since = await page("2000-01-01T00:00:00Z")
    # 45 singles, then the batch whole: the 50th item's group does not end at the 50th.
    assert ids[:45] == first_singles and sorted(ids[45:]) == sorted(batched)
    assert await page(since) == ([], since)
    # Changes made apart come at most 50 a page, and none is skipped.
    more = await singles(60)
    clock.jump(UPDATES_SETTLE.total_seconds())
    pages = []
    while (found := await page(since))[0]:
        ids, since = found
        pages.append(ids)
    assert [len(p) for p in pages] == [50, 10] and [i for p in pages for i in p] == more


async def test_the_updates_feed_misses_no_change_that_commits_late(
    service: Service, dns_server: DnsServer, clock: MockClock
) -> None:
    """A change is stamped before it commits, so one stamped earlier can commit after a later
    one a client has already read (a delivery outcome queued behind another process's write,
    another node's transaction). The feed shows a change only once it has settled, so a
    client going on from `X-Next-Since` still gets the late one."""
    account = await ready_account(service, dns_server)
    later = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    late, early = [
        (
            await account.client.post(
                "/v1/emails/", json=message(f"{n}@feed.example", send_at=later)
            )
        ).json()["id"]
        for n in ("late", "early")
    ]
    clock.jump(UPDATES_SETTLE.total_seconds())

    async def page(since: str) -> tuple[list[str], str]:
        got = await account.client.get("/v1/emails/updates", params={"since": since})
        assert got.status_code == 200, got.text
        return [e["id"] for e in got.json()], got.headers["X-Next-Since"]

    created, since = await page("2000-01-01T00:00:00Z")
    assert sorted(created) == sorted([late, early])
    runtime = service.running.runtime
    stamped = runtime.clock.now()  # the late change's time, taken before the other commits
    clock.jump(1)
    cancelled = await account.client.post(f"/v1/emails/{early}/cancel")
    assert cancelled.status_code == 200, cancelled.text
    seen = []
    while (found := await page(since))[0]:  # a client polling meanwhile
        ids, since = found
        seen += ids

    def cancel_late(tx: Tx) -> bool:  # the cancel route's change, stamped when it began
        move = statuses.email_move(statuses.SCHEDULED, Trigger.CANCEL)
        waiting = statuses.recipients_move(Trigger.CANCEL)
        return emails.cancel_scheduled(tx, account.workspace_id, late, stamped, move, waiting)

    assert await runtime.db.write(cancel_late)  # commits only now
    clock.jump(UPDATES_SETTLE.total_seconds())
    while (found := await page(since))[0]:
        ids, since = found
        seen += ids
    assert seen == [late, early]  # each change once, in the order of their times


async def test_batch_sends_each_entry_on_its_own(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "batch.example")
    entries = [message(f"r{i}@batch.example", subject=f"n{i}") for i in range(5)]
    entries[2] = message("r2@batch.example", from_={"email": "stranger@else.example"})
    entries[3] = {"to": "not a list"}
    response = await account.client.post("/v1/emails/batch", json=entries)
    assert response.status_code == 202
    results = response.json()
    assert [r["status"] for r in results] == ["queued", "queued", "error", "error", "queued"]
    assert results[2]["id"] is None and "sender" in results[2]["rejection_reason"]
    assert results[3]["id"] is None and results[3]["rejection_reason"]
    await smtp_sink.wait_for_messages(3)
    subjects = sorted(m.data.split(b"Subject: ")[1].split(b"\r\n")[0] for m in smtp_sink.messages)
    assert subjects == [b"n0", b"n1", b"n4"]


async def test_batch_plan_gates(service: Service, dns_server: DnsServer) -> None:
    free = await service.account("free")
    assert (
        await free.client.post("/v1/emails/batch", json=[message("a@b.example")])
    ).status_code == 403
    starter = await ready_account(service, dns_server, plan="starter")
    too_many = [message(f"r{i}@batch.example") for i in range(26)]
    response = await starter.client.post("/v1/emails/batch", json=too_many)
    assert response.status_code == 400
    assert response.json()["code"] == "batch_too_large"
    assert (
        await starter.client.post("/v1/emails/batch", json={"not": "an array"})
    ).status_code == 422


async def test_saved_searches_are_replaced_whole(service: Service) -> None:
    account = await service.account()
    assert (await account.client.get("/v1/emails/saved-searches")).json() == {"searches": []}
    searches = [
        {"name": "Bounces", "query": "status:bounced", "range": "7d"},
        {"name": "News", "query": "tag:news"},
    ]
    saved = await account.client.put("/v1/emails/saved-searches", json={"searches": searches})
    assert saved.status_code == 200
    listed = (await account.client.get("/v1/emails/saved-searches")).json()["searches"]
    assert [(s["name"], s["query"]) for s in listed] == [
        ("Bounces", "status:bounced"),
        ("News", "tag:news"),
    ]
    assert all(s["id"] for s in listed)
    # The date filters are kept as given: a day as a day, a time as a time.
    dated = {
        "name": "November",
        "created_from": "2026-11-01",
        "created_before": "2026-12-01T06:00:00Z",
    }
    saved = await account.client.put("/v1/emails/saved-searches", json={"searches": [dated]})
    assert saved.status_code == 200
    [kept] = (await account.client.get("/v1/emails/saved-searches")).json()["searches"]
    assert (kept["created_from"], kept["created_before"]) == ("2026-11-01", "2026-12-01T06:00:00Z")
    wrong = {"searches": [{"name": "x", "created_from": "last week"}]}
    assert (await account.client.put("/v1/emails/saved-searches", json=wrong)).status_code == 422
    too_many = {"searches": [{"name": f"s{i}"} for i in range(51)]}
    assert (await account.client.put("/v1/emails/saved-searches", json=too_many)).status_code == 422
    await account.client.put("/v1/emails/saved-searches", json={"searches": []})
    assert (await account.client.get("/v1/emails/saved-searches")).json() == {"searches": []}
    other = await service.account()
    assert (await other.client.get("/v1/emails/saved-searches")).json() == {"searches": []}


async def test_monthly_volume_is_enforced(service: Service, dns_server: DnsServer) -> None:
    from storage import emails as stored_emails

    account = await ready_account(service, dns_server, plan="free")
    month = service.running.runtime.clock.now().strftime("%Y-%m")
    # Arrange a month in which 2,999 of the Free plan's 3,000 emails have gone out, counted
    # by two nodes in shards of their own: the volume is their sum.
    for shard, sent in ((3, 2000), (11, 999)):
        await service.running.runtime.db.write(
            stored_emails.count_sent, account.workspace_id, month, sent, shard
        )
    route_mail(dns_server, "quota.example")
    assert (
        await account.client.post("/v1/emails/", json=message("a@quota.example"))
    ).status_code == 202
    refused = await account.client.post("/v1/emails/", json=message("b@quota.example"))
    assert refused.status_code == 403
    assert refused.json()["code"] == "plan_limit"
    checked = (
        await account.client.post("/v1/emails/validate", json=message("b@quota.example"))
    ).json()
    assert checked["valid"] is False
    assert [i["field"] for i in checked["issues"]] == ["limits"]


async def test_single_sends_stored_together_are_each_answered_as_if_alone(
    service: Service, dns_server: DnsServer
) -> None:
    from storage import emails as stored_emails

    # Concurrent sends meet in one group commit, which stores them as one batch per
    # workspace: each must still get the answer it would get alone.
    near_limit = await ready_account(service, dns_server, plan="free")
    other = await service.account("starter")
    await add_domain(other, dns_server, "other.example.org")
    their = {"email": "hello@other.example.org"}
    assert (await other.client.post("/v1/senders/", json=their)).status_code == 201
    month = service.running.runtime.clock.now().strftime("%Y-%m")
    await service.running.runtime.db.write(
        stored_emails.count_sent, near_limit.workspace_id, month, 2998, 1
    )
    route_mail(dns_server, "together.example")
    assert (
        await other.client.post("/v1/suppressions/", json={"email": "gone@together.example"})
    ).status_code == 201
    sends = [
        *[(near_limit, message(f"n{i}@together.example")) for i in range(4)],
        *[(other, message(f"o{i}@together.example", from_=their)) for i in range(3)],
        (other, message("gone@together.example", from_=their)),
        (other, message("x@together.example", from_={"email": "nobody@other.example.org"})),
    ]
    answers: list[tuple[int, str]] = [(0, "")] * len(sends)

    async def send(i: int) -> None:
        account, body = sends[i]
        response = await account.client.post("/v1/emails/", json=body)
        answers[i] = (
            response.status_code,
            response.json().get("status") or response.json()["code"],
        )

    async with trio.open_nursery() as nursery:
        for i in range(len(sends)):
            nursery.start_soon(send, i)

    assert sorted(answers[:4]) == [(202, "queued")] * 2 + [(403, "plan_limit")] * 2
    assert answers[4:7] == [(202, "queued")] * 3
    assert answers[7] == (202, "rejected")
    assert answers[8][0] == 422
    assert len((await near_limit.client.get("/v1/emails/")).json()) == 2
    assert len((await other.client.get("/v1/emails/")).json()) == 4


async def test_idempotency_key_sends_once(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "once.example")
    headers = {"Idempotency-Key": "order-1234"}
    body = message("o@once.example")
    first = await account.client.post("/v1/emails/", json=body, headers=headers)
    again = await account.client.post("/v1/emails/", json=body, headers=headers)
    assert first.status_code == again.status_code == 202
    assert again.json() == first.json()
    changed = await account.client.post(
        "/v1/emails/", json=message("p@once.example"), headers=headers
    )
    assert changed.status_code == 409
    assert changed.json()["code"] == "idempotency_conflict"
    other = await service.account("starter")  # keys are per workspace
    assert (await other.client.post("/v1/emails/", json=body, headers=headers)).status_code == 422
    await smtp_sink.wait_for_messages(1)
    clock.jump(24 * 3600 + 1)
    later = await account.client.post("/v1/emails/", json=body, headers=headers)
    assert later.json()["id"] != first.json()["id"]  # the key expired: a new email
    bad = await account.client.post(
        "/v1/emails/", json=body, headers={"Idempotency-Key": "x" * 257}
    )
    assert bad.status_code == 422
    listed = (await account.client.get("/v1/emails/")).json()
    assert len(listed) == 2


async def test_address_suppressed_after_scheduling_is_not_sent_to(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    body = message(["gone@later.example", "stays@later.example"], send_at=send_at)
    sent = (await account.client.post("/v1/emails/", json=body)).json()
    await account.client.post("/v1/suppressions/", json={"email": "gone@later.example"})
    clock.jump(3601)
    [received] = await smtp_sink.wait_for_messages(1)
    assert received.rcpt_to == ("stays@later.example",)
    email = await wait_for_status(account, sent["id"])
    outcomes = {r["address"]: r["status"] for r in email["recipients"]}
    assert outcomes == {"gone@later.example": "failed", "stays@later.example": "delivered"}


async def test_deleting_the_domain_fails_its_queued_mail_and_delivery_goes_on(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "later.example")
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    sent = (
        await account.client.post("/v1/emails/", json=message("x@later.example", send_at=send_at))
    ).json()
    domain = (await account.client.get("/v1/domains/")).json()[0]
    assert (await account.client.delete(f"/v1/domains/{domain['id']}")).status_code == 204
    clock.jump(3601)
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "failed"
    assert "deleted" in email["events"][-1]["metadata"]["error"]
    assert (await service.client().get("/healthz")).status_code == 200


async def test_domain_without_mx_is_reached_at_its_address(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    dns_server.set("plain.example", "A", ["127.0.0.1"])  # no MX: the A record stands in
    sent = (await account.client.post("/v1/emails/", json=message("p@plain.example"))).json()
    await smtp_sink.wait_for_messages(1)
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"


async def test_null_mx_bounces_without_connecting(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    dns_server.set("nomail.example", "MX", ["0 ."])
    sent = (await account.client.post("/v1/emails/", json=message("n@nomail.example"))).json()
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "bounced"
    assert "null MX" in email["events"][-1]["metadata"]["response"]
    assert smtp_sink.connections == 0


async def test_list_filters_pages_and_orders_newest_first(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "list.example")
    await account.client.post("/v1/suppressions/", json={"email": "blocked@list.example"})
    ids = []
    for i in range(5):
        ids.append(
            (await account.client.post("/v1/emails/", json=message(f"r{i}@list.example"))).json()[
                "id"
            ]
        )
        clock.jump(1)
    rejected = (
        await account.client.post("/v1/emails/", json=message("blocked@list.example"))
    ).json()
    for email_id in ids:
        await wait_for_status(account, email_id)

    listed = (await account.client.get("/v1/emails/")).json()
    assert [e["id"] for e in listed] == [rejected["id"], *reversed(ids)]
    assert set(listed[0]) == {
        "id",
        "from_address",
        "to_addresses",
        "subject",
        "status",
        "tags",
        "source",
        "created_at",
        "delivered_at",
    }
    page = (await account.client.get("/v1/emails/", params={"limit": 2, "page": 1})).json()
    assert [e["id"] for e in page] == [ids[3], ids[2]]
    only = (await account.client.get("/v1/emails/", params={"status": "rejected"})).json()
    assert [e["id"] for e in only] == [rejected["id"]]
    for params in ({"limit": 0}, {"limit": 101}, {"page": -1}, {"status": "lost"}):
        assert (await account.client.get("/v1/emails/", params=params)).status_code == 422
