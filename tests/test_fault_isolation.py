"""Nothing a tenant or a stranger sends can stop the service (issue 14, part 1).

Each attack is replayed against the real service: URLs that cannot be sent to are refused
when saved; the same URLs stored by an older release (planted in the database) fail their
attempts, and a restart comes back healthy and serving; rows that make an actor raise are
quarantined after three faults, or fail alone, while the work beside them goes on.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
from trio.testing import MockClock

from postroom.service import RunningService, serve
from storage.tx import Tx
from tests.harness import service as harness
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.inbound import SOURCE, forwarding_account, letter, rule, send_inbound
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Service
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

# Accepted with 201 before, each then stopping the process at its first delivery (or 500).
BAD_URLS = [
    "https://hooks.example.com/x\n",
    "https://hooks.example.com/x\r",
    "https://hooks.example.com/x\t",
    "https://hooks.example.com/x\x7f",
    "https://hooks.example.com/x#a\x0bb",
    "https://hooks.example.com:abc/x",
    "https://hooks.example.com:99999/x",
    "https://[::1/x",
    "https://h.com]/x",
    "https://a..b.com/x",
    "https://" + "a" * 64 + ".com/x",
    "https://☃.com/x",
    "https://xn--n3h.com/x",
    "https://user:secret@hooks.example.com/x",
]
EVENTS = ["email.delivered"]


async def test_urls_that_cannot_be_sent_to_are_refused_when_saved(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    good = https_receiver.url + "/hook"
    hook = (await account.client.post("/v1/webhooks/", json={"url": good, "events": EVENTS})).json()
    forward = (
        await account.client.post("/v1/forwards/", json=rule(domain, destination_urls=[good]))
    ).json()
    for url in BAD_URLS:
        attempts = [
            await account.client.post("/v1/webhooks/", json={"url": url, "events": EVENTS}),
            await account.client.patch(f"/v1/webhooks/{hook['id']}", json={"url": url}),
            await account.client.post(
                "/v1/forwards/",
                json=rule(domain, source_email=f"other@{domain['name']}", destination_urls=[url]),
            ),
            await account.client.patch(
                f"/v1/forwards/{forward['id']}", json={"destination_urls": [url]}
            ),
        ]
        for response in attempts:
            assert response.status_code == 422, (url, response.text)
            body = response.json()
            assert body["code"] == "validation_error" and body["detail"], url
    assert [h["url"] for h in (await account.client.get("/v1/webhooks/")).json()] == [good]


async def _attempts(service: Service, table: str, column: str) -> list[dict[str, Any]]:
    def read(tx: Tx) -> list[dict[str, Any]]:
        return tx.all(f"SELECT status, attempt, {column} AS error FROM {table} ORDER BY id")

    return await service.running.runtime.db.read(read)


async def _until(check: Any, seconds: float = 15) -> Any:
    with trio.fail_after(seconds):
        while True:
            found = await check()
            if found:
                return found
            await trio.sleep(0.05)


async def test_urls_stored_by_an_older_release_fail_their_attempts_and_a_restart_serves(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    https_receiver: HttpsReceiver,
    tls_ca: TlsAuthority,
    clock: MockClock,
) -> None:
    # Private targets off: every host is looked up through the test's DNS server, never
    # through the system's.
    settings = harness.test_settings(
        database_url,
        dns_server,
        extra_ca_file=str(tls_ca.ca_file),
        delivery_port=str(smtp_sink.port),
        allow_private_targets="off",
    )
    running: RunningService = await nursery.start(serve, settings)
    service = harness.Service(running, clock)
    account, domain = await forwarding_account(service, dns_server)
    # Saved while the name points at a public address; never called: replaced below.
    dns_server.set("hooks.example.net", "A", ["93.184.216.34"])
    good = "https://hooks.example.net/hook"
    created = await account.client.post(
        "/v1/forwards/", json=rule(domain, destination_emails=[], destination_urls=[good])
    )
    assert created.status_code == 201, created.text
    for _ in BAD_URLS:
        await account.client.post("/v1/webhooks/", json={"url": good, "events": EVENTS})
    hooks = (await account.client.get("/v1/webhooks/")).json()

    def as_an_older_release_saved_them(tx: Tx) -> None:
        for hook, url in zip(hooks, BAD_URLS, strict=True):
            tx.execute(
                "UPDATE webhooks SET url = :url WHERE id = :id", {"url": url, "id": hook["id"]}
            )
        tx.execute(
            "UPDATE forwards SET destination_urls = :urls", {"urls": '["https://x.com/\\n"]'}
        )

    await running.runtime.db.write(as_an_older_release_saved_them)
    for hook in hooks:
        assert (await account.client.post(f"/v1/webhooks/{hook['id']}/test")).status_code == 200
    assert await send_inbound(service, [SOURCE], letter()) == set()
    assert https_receiver.requests == []

    async def all_failed_once() -> bool:
        deliveries = await _attempts(service, "webhook_deliveries", "response_body")
        jobs = await _attempts(service, "forward_jobs", "last_error")
        return len(deliveries) == len(BAD_URLS) and all(
            a["status"] == "retrying" and a["attempt"] == 1 and a["error"]
            for a in [*deliveries, *jobs]
        )

    await _until(all_failed_once)
    await service.aclose()
    running.stop()

    # Started again over the same database, it claims the same rows and stays up.
    again: RunningService = await nursery.start(serve, settings)
    service = harness.Service(again, clock)
    client = service.client(headers={"Authorization": f"Bearer {account.api_key}"})
    assert (await client.get("/healthz")).status_code == 200
    clock.jump(60)

    async def all_failed_twice() -> bool:
        rows = [
            *await _attempts(service, "webhook_deliveries", "response_body"),
            *await _attempts(service, "forward_jobs", "last_error"),
        ]
        return all(a["attempt"] == 2 for a in rows)

    await _until(all_failed_twice)
    assert (await client.get("/healthz")).status_code == 200
    assert len((await client.get("/v1/webhooks/")).json()) == len(BAD_URLS)
    await service.aclose()
    again.stop()


async def test_a_job_that_makes_the_forwarder_raise_is_quarantined_after_three_faults(
    service: Service, dns_server: DnsServer, https_receiver: HttpsReceiver, clock: MockClock
) -> None:
    account, domain = await forwarding_account(service, dns_server)
    url = https_receiver.url + "/in"
    body = rule(domain, destination_emails=[], destination_urls=[url])
    assert (await account.client.post("/v1/forwards/", json=body)).status_code == 201
    rt = service.running.runtime

    def planted_unreadable_message(tx: Tx) -> None:
        # A stored message no code can read: every claim of its job used to raise.
        tx.execute("UPDATE inbound_messages SET recipients = '{not json'")

    https_receiver.respond(500)  # the first message's job stays due while the row is planted
    assert await send_inbound(service, [SOURCE], letter(subject="poisoned")) == set()

    async def attempted_once() -> bool:
        return [a["attempt"] for a in await _attempts(service, "forward_jobs", "last_error")] == [1]

    await _until(attempted_once)
    await rt.db.write(planted_unreadable_message)
    https_receiver.respond(200)
    for faults in (1, 2, 3):
        clock.jump(60 * 60)  # past the fault retry (1 m) and the attempt retry (1 m)

        async def counted(faults: int = faults) -> bool:
            def read(tx: Tx) -> Any:
                return tx.value("SELECT faults FROM forward_jobs")

            return bool(await rt.db.read(read) == faults)

        await _until(counted)
    jobs = await _attempts(service, "forward_jobs", "last_error")
    [job] = jobs
    assert job["status"] == "failed"
    assert job["error"].startswith("quarantined after 3 faults: the stored message cannot be read")

    # The forwarder is alive and works the next message.
    assert await send_inbound(service, [SOURCE], letter(subject="healthy")) == set()
    first, then = await https_receiver.wait_for_requests(2)
    assert (first.json()["subject"], then.json()["subject"]) == ("poisoned", "healthy")
    metrics = (await service.client().get("/metrics")).text
    assert 'postroom_work_faults_total{actor="forwarder"} 3.0' in metrics
    assert 'postroom_work_quarantined_total{actor="forwarder"} 1.0' in metrics


async def test_an_email_no_code_can_build_or_read_fails_alone(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "round.example")
    rt = service.running.runtime
    ids = []
    for local in ("first", "second", "third"):
        body = message(f"{local}@round.example")
        ids.append((await account.client.post("/v1/emails/", json=body)).json()["id"])
    await wait_for_status(account, ids[2])
    smtp_sink.messages.clear()

    # Waiting to be retried (as after a 4xx), two of them planted broken: one whose stored
    # headers make the message builder raise, one whose row cannot be read at all.
    def planted(tx: Tx) -> None:
        tx.execute(
            "UPDATE email_recipients SET status = 'deferred', next_attempt_at = :at",
            {"at": "2000-01-01T00:00:00.000000Z"},
        )
        tx.execute("UPDATE emails SET headers = '\"oops\"' WHERE id = :id", {"id": ids[0]})
        tx.execute("UPDATE emails SET created_at = 'garbage' WHERE id = :id", {"id": ids[1]})

    await rt.db.write(planted)
    rt.wakeups.deliver(["mail:round.example"])

    async def settled() -> list[dict[str, Any]] | None:
        def read(tx: Tx) -> list[dict[str, Any]]:
            return tx.all(
                "SELECT email_id, status, last_response FROM email_recipients ORDER BY email_id"
            )

        rows = await rt.db.read(read)
        return rows if all(r["status"] in ("delivered", "failed") for r in rows) else None

    rows = {row["email_id"]: row for row in await _until(settled)}
    assert rows[ids[0]]["status"] == "failed"
    assert "cannot build the message: AttributeError" in rows[ids[0]]["last_response"]
    assert rows[ids[1]]["status"] == "failed"
    assert "the stored email cannot be read" in rows[ids[1]]["last_response"]
    assert rows[ids[2]]["status"] == "delivered"
    assert [m.rcpt_to for m in smtp_sink.messages] == [("third@round.example",)]
    assert (await service.client().get("/healthz")).status_code == 200


async def test_an_actor_that_raises_is_restarted_and_counted_while_the_rest_goes_on(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server)
    pending = (await account.client.post("/v1/domains/", json={"name": "later.example"})).json()
    rt = service.running.runtime

    def planted(tx: Tx) -> None:  # a pending domain whose row the checker cannot read
        tx.execute(
            "UPDATE domains SET created_at = 'garbage' WHERE id = :id", {"id": pending["id"]}
        )

    await rt.db.write(planted)
    clock.jump(5 * 60)  # the domain checker's round reads the planted row and raises
    metrics_client = service.client()

    async def restarted() -> bool:
        metrics = (await metrics_client.get("/metrics")).text
        return 'postroom_actor_restarts_total{actor="domain_checker"} 1.0' in metrics

    await _until(restarted)
    assert (await metrics_client.get("/healthz")).status_code == 200
    route_mail(dns_server, "still.example")
    sent = (await account.client.post("/v1/emails/", json=message("ok@still.example"))).json()
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"


@pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)
async def test_mail_in_flight_when_the_database_drops_the_connections_is_delivered(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, database_url: str
) -> None:
    """The database drops every connection while a delivery round is on the wire: the mail
    in flight is delivered all the same (if the round's record fails, its actor is restarted
    and the recipients its node held, whose leases the heartbeat renews, are worked again)."""
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "slow.example")
    smtp_sink.data_delay = 1.0  # the round is still on the wire when the connections go
    sent = [
        (await account.client.post("/v1/emails/", json=message(f"r{i}@slow.example"))).json()
        for i in range(3)
    ]

    async def on_the_wire() -> bool:
        return smtp_sink.open_transactions > 0

    await _until(on_the_wire)

    def drop_connections() -> int:
        with psycopg.connect(database_url, autocommit=True) as conn:
            return len(
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity"
                    " WHERE datname = current_database() AND pid <> pg_backend_pid()"
                ).fetchall()
            )

    assert await trio.to_thread.run_sync(drop_connections) > 0

    async def round_over() -> bool:
        return smtp_sink.open_transactions == 0

    # Whichever unit of work next takes a dropped connection fails: mostly the round's record
    # of its outcomes (the delivery actor is restarted, and the recipients its node holds are
    # worked again); on a loaded machine sometimes another actor's first, and the round then
    # records on a fresh connection. Either way, every email in flight is delivered.
    await _until(round_over)  # (no API read before: a read replaces dropped connections)
    for email in sent:
        assert (await wait_for_status(account, email["id"]))["status"] == "delivered"
    delivered = {m.rcpt_to[0] for m in smtp_sink.messages}
    assert delivered == {f"r{i}@slow.example" for i in range(3)}
