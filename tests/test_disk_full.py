"""A database with no room left: writes refused cleanly (507 `storage_full`, SMTP 452 4.3.1),
nothing accepted lost, /healthz and /metrics saying so, and recovery once space returns.

SQLite is made full for real: `PRAGMA max_page_count` on the service's own writer connection
(it is persistent, so the limit sticks), set through a unit of work like any other write.
SQLite then answers SQLITE_FULL exactly as on a full disk, rolling the whole transaction
back. PostgreSQL's disk_full cannot be provoked on a shared server, so the server itself
raises SQLSTATE 53100 from plpgsql inside a unit of work.
"""

from __future__ import annotations

import smtplib
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any

import outcome
import psycopg
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from storage import leaderships, nodes
from storage.database import Database, open_database
from storage.errors import StorageFull
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.sending import SENDER, message, ready_account, route_mail
from tests.harness.service import Account, Service
from tests.harness.tls import TlsAuthority

sqlite_only = pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
postgresql_only = pytest.mark.parametrize("database_url", ["postgresql"], indirect=True)

NO_LIMIT = 1_000_000_000  # pages: far more than any test writes


LEASE, LEASE_TIME = "disk-full-test", timedelta(seconds=30)  # a leadership held meanwhile


def _limit_pages(tx: Tx, room: int) -> None:
    """Let the database grow by `room` pages at most (SQLite, on the connection it runs on)."""
    pages = tx.value("PRAGMA page_count")
    tx.value(f"PRAGMA max_page_count = {pages + room}")


async def _all(calls: list[Callable[[], Awaitable[Any]]]) -> list[outcome.Outcome[Any]]:
    """Run calls at once (so the group-commit writer takes them in one batch); their outcomes."""
    results: list[outcome.Outcome[Any]] = [outcome.Value(None)] * len(calls)

    async def run(i: int) -> None:
        results[i] = await outcome.acapture(calls[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(calls)):
            nursery.start_soon(run, i)
    return results


def _scheduled(to: str, lines: int = 300) -> dict[str, Any]:
    # Scheduled an hour ahead: nothing is delivered (no delivery writes) during the test.
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    return message(to, send_at=send_at, html="<p>" + "receipt line " * lines + "</p>")


async def _fill(service: Service, account: Account) -> list[str]:
    """Send eight at a time until sends are refused, then one larger than any room left
    (a smaller one may still fit in a page's free space): the ids of the accepted sends."""
    await service.running.runtime.db.write(_limit_pages, 24)
    accepted: list[str] = []
    statuses: set[int] = set()
    for _ in range(50):
        sends = [_scheduled(f"r{i}@full.example") for i in range(8)]
        responses = await _all([partial(account.client.post, "/v1/emails/", json=s) for s in sends])
        for response in (r.unwrap() for r in responses):
            assert response.status_code in (202, 507), response.text
            statuses.add(response.status_code)
            if response.status_code == 202:
                accepted.append(response.json()["id"])
        if 507 in statuses:
            break
    assert statuses == {202, 507}
    too_big = await account.client.post("/v1/emails/", json=_scheduled("big@full.example", 20_000))
    assert too_big.status_code == 507
    assert too_big.json()["code"] == "storage_full"
    assert too_big.headers["Retry-After"] == "60"
    return accepted


async def _storage_full_gauge(service: Service) -> float:
    response = await service.client().get("/metrics")
    [family] = [
        f
        for f in text_string_to_metric_families(response.text)
        if f.name == "postroom_storage_full"
    ]
    return float(family.samples[0].value)


@sqlite_only
async def test_full_database_refuses_sends_with_507_keeps_accepted_mail_and_recovers(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server)
    runtime = service.running.runtime
    now = runtime.clock.now()
    assert await runtime.db.write(leaderships.hold, LEASE, runtime.node, now, now + LEASE_TIME)

    accepted = await _fill(service, account)
    # A heartbeat or a lease renewal (updates in place, which still fit; the renewal is an
    # upsert) is no sign of room: the state holds.
    assert await runtime.db.write(nodes.beat, runtime.node, now, now + timedelta(seconds=30), None)
    renewed = await runtime.db.write(leaderships.hold, LEASE, runtime.node, now, now + LEASE_TIME)
    assert renewed

    for email_id in accepted:  # every 202 was committed and is readable
        email = await account.client.get(f"/v1/emails/{email_id}")
        assert email.status_code == 200
        assert email.json()["status"] == "scheduled"
    listed = (await account.client.get("/v1/emails/", params={"limit": 100})).json()
    assert sorted(e["id"] for e in listed) == sorted(accepted)  # a 507 stored nothing
    health = await service.client().get("/healthz")
    assert health.status_code == 503
    assert health.json()["status"] == "degraded"
    assert health.json()["storage"] == "full: SQLITE_FULL"
    assert await _storage_full_gauge(service) == 1

    # Space returns: the state clears with the next write that stores something (a send, or
    # the node's heartbeat, whichever comes first).
    await service.running.runtime.db.write(
        lambda tx: tx.value(f"PRAGMA max_page_count = {NO_LIMIT}")
    )
    again = await account.client.post("/v1/emails/", json=_scheduled("after@full.example"))
    assert again.status_code == 202
    health = await service.client().get("/healthz")
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    assert await _storage_full_gauge(service) == 0
    for email_id in [*accepted, again.json()["id"]]:
        assert (await account.client.get(f"/v1/emails/{email_id}")).status_code == 200


def _submit(service: Service, tls_ca: TlsAuthority, credential: dict[str, Any]) -> None:
    """One 200 KB message through the submission relay, as a mail client sends it (blocking);
    far more than the pages a full database has left."""
    host, port = service.submission_address
    with smtplib.SMTP(host, port, timeout=15) as smtp:
        smtp.starttls(context=tls_ca.client_context())
        smtp.login(credential["username"], credential["password"])
        text = ("A line of the report. " * 3 + "\r\n") * 3000
        body = f"From: <{SENDER}>\r\nTo: <ann@full.example>\r\nSubject: Hi\r\n\r\n{text}"
        smtp.sendmail(SENDER, ["ann@full.example"], body)


@sqlite_only
async def test_submission_answers_452_insufficient_storage_while_the_database_is_full(
    service: Service, dns_server: DnsServer, tls_ca: TlsAuthority
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "full.example")
    [domain] = (await account.client.get("/v1/domains/")).json()
    created = await account.client.post("/v1/smtp-credentials/", json={"domain_id": domain["id"]})
    credential = created.json()
    await _fill(service, account)

    with pytest.raises(smtplib.SMTPDataError) as refused:
        await trio.to_thread.run_sync(_submit, service, tls_ca, credential)
    assert refused.value.smtp_code == 452
    assert refused.value.smtp_error == b"4.3.1 Insufficient system storage, try again later"

    await service.running.runtime.db.write(
        lambda tx: tx.value(f"PRAGMA max_page_count = {NO_LIMIT}")
    )
    await trio.to_thread.run_sync(_submit, service, tls_ca, credential)  # 250 again


def _create_table(tx: Tx) -> None:
    tx.execute("CREATE TABLE notes (body TEXT NOT NULL)")


def _note(tx: Tx, body: str) -> None:
    tx.execute("INSERT INTO notes (body) VALUES (:body)", {"body": body})


async def _notes(db: Database) -> list[str]:
    rows = await db.read(lambda tx: tx.all("SELECT body FROM notes ORDER BY body"))
    return [row["body"] for row in rows]


@sqlite_only
async def test_sqlite_full_in_a_batch_fails_the_whole_batch_and_the_writer_goes_on(
    database_url: str,
) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        await db.write(_limit_pages, 2)
        # The big note cannot fit: SQLite rolls back the whole transaction, the small notes
        # written before it in the same batch included.
        results = await _all(
            [
                lambda: db.write(_note, "a"),
                lambda: db.write(_note, "b" * 100_000),
                lambda: db.write(_note, "c"),
            ]
        )
        assert db.writer_statistics().largest_batch == 3
        for result in results:
            assert isinstance(result, outcome.Error)
            assert isinstance(result.error, StorageFull)
        assert await _notes(db) == []
        assert db.storage_full is not None

        await db.write(_note, "d")  # the writer was not left in a broken transaction
        assert await _notes(db) == ["d"]
        assert db.storage_full is None


def _disk_full(tx: Tx) -> None:
    tx.execute(
        "DO $$ BEGIN RAISE EXCEPTION 'could not extend file' USING ERRCODE = '53100'; END $$"
    )


@postgresql_only
async def test_postgresql_disk_full_is_storage_full_and_clears_on_the_next_stored_write(
    database_url: str,
) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)

        with pytest.raises(StorageFull) as alone:
            await db.write(_disk_full)
        assert isinstance(alone.value.__cause__, psycopg.errors.DiskFull)
        assert db.storage_full is not None

        # In a batch only the refused unit is rolled back (to its savepoint).
        results = await _all(
            [
                lambda: db.write(_note, "a"),
                lambda: db.write(_disk_full),
                lambda: db.write(_note, "b"),
            ]
        )
        assert db.writer_statistics().largest_batch == 3
        first, refused, third = results
        assert isinstance(first, outcome.Value) and isinstance(third, outcome.Value)
        assert isinstance(refused, outcome.Error) and isinstance(refused.error, StorageFull)
        assert await _notes(db) == ["a", "b"]
        assert db.storage_full is not None  # that batch stored notes, but one was refused

        await db.write(lambda tx: tx.value("SELECT 1"))  # stores nothing: proves nothing
        assert db.storage_full is not None
        await db.write(_note, "c")
        assert db.storage_full is None
