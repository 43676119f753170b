"""Storage on both engines: group commit, per-unit isolation, migrations, durability."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import outcome
import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st

from engine.sending import statuses
from storage import accounts, delivery, emails, migrations
from storage.codec import new_id, parse_timestamp, timestamp
from storage.database import Database, open_database
from storage.engines import in_one_snapshot, pipelining, runs_together
from storage.sealing import NO_MASTER_KEY
from storage.tx import Tx, to_pyformat
from tests.harness.service import fresh_postgres_database


def _create_table(tx: Tx) -> None:
    tx.execute("CREATE TABLE notes (id INTEGER PRIMARY KEY, body TEXT NOT NULL)")


def _insert(tx: Tx, note_id: int, body: str) -> int:
    return tx.execute(
        "INSERT INTO notes (id, body) VALUES (:id, :body)", {"id": note_id, "body": body}
    )


def _insert_then_fail(tx: Tx, note_id: int) -> None:
    _insert(tx, note_id, "half-done")
    raise LookupError("unit gave up after writing")


def _bodies(tx: Tx) -> dict[int, str]:
    return {row["id"]: row["body"] for row in tx.all("SELECT id, body FROM notes ORDER BY id")}


async def test_concurrent_writes_share_transactions(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        async with trio.open_nursery() as nursery:
            for i in range(300):
                nursery.start_soon(db.write, _insert, i, f"note {i}")
        stats = db.writer_statistics()
        assert len(await db.read(_bodies)) == 300
        assert stats.units >= 300
        assert stats.batches < 300  # grouped: fewer commits than units
        assert stats.largest_batch > 1


async def test_a_failing_unit_rolls_back_alone(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        outcomes: dict[int, str] = {}

        async def attempt(note_id: int) -> None:
            try:
                if note_id % 3 == 0:
                    await db.write(_insert_then_fail, note_id)
                else:
                    await db.write(_insert, note_id, "kept")
                outcomes[note_id] = "ok"
            except LookupError:
                outcomes[note_id] = "failed"

        async with trio.open_nursery() as nursery:
            for i in range(60):
                nursery.start_soon(attempt, i)
        bodies = await db.read(_bodies)
        assert all(outcomes[i] == "failed" for i in range(0, 60, 3))
        assert sorted(bodies) == [i for i in range(60) if i % 3]
        assert set(bodies.values()) == {"kept"}


_JOINT_SIZES: list[int] = []  # how many calls each run of _insert_notes took


def _insert_notes(tx: Tx, calls: list[tuple[Any, ...]]) -> list[outcome.Outcome[int]]:
    """`_insert_note`'s calls run together: one multi-row statement; an odd id is refused
    (an Error outcome, nothing written); a body "poison" fails the joint call as a whole."""
    _JOINT_SIZES.append(len(calls))
    if any(body == "poison" for _, body in calls):
        raise LookupError("the joint call cannot go on")
    kept = [(note_id, body) for note_id, body in calls if note_id % 2 == 0]
    tx.execute_many(
        "INSERT INTO notes (id, body) VALUES (:id, :body)",
        [{"id": note_id, "body": body} for note_id, body in kept],
    )
    return [
        outcome.Value(1) if note_id % 2 == 0 else outcome.Error(ValueError(f"odd {note_id}"))
        for note_id, _ in calls
    ]


@runs_together(_insert_notes)
def _insert_note(tx: Tx, note_id: int, body: str) -> int:
    [result] = _insert_notes(tx, [(note_id, body)])
    return int(result.unwrap())


async def test_units_that_run_together_answer_each_caller_as_if_alone(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        answers: dict[int, str] = {}

        async def attempt(note_id: int, body: str) -> None:
            try:
                answers[note_id] = str(await db.write(_insert_note, note_id, body))
            except (ValueError, LookupError) as exc:
                answers[note_id] = type(exc).__name__

        async with trio.open_nursery() as nursery:
            for i in range(40):
                nursery.start_soon(attempt, i, "poison" if i == 10 else "kept")
        assert max(_JOINT_SIZES) > 1  # calls did run together
        # The poisoned call failed its joint call: each call then ran alone, and only the
        # poisoned one failed (with its own error); refusals reached only their callers.
        assert answers == {
            i: "LookupError" if i == 10 else "1" if i % 2 == 0 else "ValueError" for i in range(40)
        }
        assert sorted(await db.read(_bodies)) == [i for i in range(0, 40, 2) if i != 10]


@pipelining
def _renumber(tx: Tx, note_id: int, body: str) -> tuple[int, dict[int, str]]:
    """A pipelined unit: an insert and an update whose results it does not read, a count it
    does read, then what it wrote; a body "clash" makes its insert fail."""
    tx.run(
        "INSERT INTO notes (id, body) VALUES (:id, :body)",
        {"id": 1 if body == "clash" else note_id, "body": body},
    )
    tx.run("UPDATE notes SET body = body || '!' WHERE id = :id", {"id": note_id})
    touched = tx.execute("UPDATE notes SET body = body || '?' WHERE id >= 1000", {})
    return touched, _bodies(tx)


@pipelining
def _append(tx: Tx, note_id: int) -> None:
    """A pipelined unit that reads nothing: its statements and COMMIT go in one sync."""
    tx.run("UPDATE notes SET body = body || '+' WHERE id = :id", {"id": note_id})


async def test_a_pipelined_unit_reads_exact_counts_and_its_own_writes_and_fails_alone(
    database_url: str,
) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        await db.write(_insert, 1, "first")
        touched, seen = await db.write(_renumber, 1000, "a")
        assert (touched, seen) == (1, {1: "first", 1000: "a!?"})
        answers: dict[int, object] = {}

        async def attempt(note_id: int, body: str) -> None:
            try:
                answers[note_id] = (await db.write(_renumber, note_id, body))[0]
            except Exception as exc:
                answers[note_id] = type(exc).__name__

        # In batches with others, then alone (each clash after more than psycopg's five uses,
        # which prepare a statement): a statement it did not read fails its unit only.
        async with trio.open_nursery() as nursery:
            for i in range(1001, 1021):
                nursery.start_soon(attempt, i, "clash" if i % 5 == 0 else "b")
        assert db.writer_statistics().largest_batch > 1
        for i in range(1021, 1041):
            await attempt(i, "clash" if i % 5 == 0 else "b")
        clashed = {i for i in range(1001, 1041) if i % 5 == 0}
        written = set(range(1001, 1041)) - clashed
        assert all(isinstance(answers[i], str) for i in clashed), answers
        assert all(isinstance(answers[i], int) for i in written), answers
        bodies = await db.read(_bodies)
        assert sorted(bodies) == [1, 1000, *sorted(written)]
        assert bodies[1] == "first"
        # Each later unit's count covered every row at 1000 or above committed before it.
        assert max(a for a in answers.values() if isinstance(a, int)) == len(bodies) - 1
        # One that reads nothing commits too (another connection reads it).
        await db.write(_append, 1)
        assert (await db.read(_bodies))[1] == "first+"


async def test_a_constraint_violation_reaches_only_its_caller(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        await db.write(_insert, 1, "first")
        with pytest.raises(Exception) as raised:
            await db.write(_insert, 1, "duplicate")
        assert "unique" in str(raised.value).lower() or "duplicate" in str(raised.value).lower()
        await db.write(_insert, 2, "second")
        assert await db.read(_bodies) == {1: "first", 2: "second"}


async def test_a_unit_submitted_while_the_service_is_cancelled_ends_with_the_cancellation(
    database_url: str,
) -> None:
    """A service cancelled from outside closes its database while its actors still run; one
    that asks the database then sees the cancellation, not "the database is closing" (which
    escaped the supervisor and failed a test's teardown), and one asking outside any
    cancellation still hears that the database is closed."""
    asked: list[str] = []
    with trio.CancelScope() as service:
        async with open_database(database_url) as db:

            async def actor() -> None:
                with trio.CancelScope(shield=True):
                    await trio.sleep(0.2)  # the cancellation reaches the database first
                asked.append("asking")
                await db.read(lambda tx: tx.value("SELECT 1"))
                asked.append("answered")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(actor)
                await trio.sleep(0.05)
                service.cancel()
    assert service.cancelled_caught and asked == ["asking"]
    with pytest.raises(trio.ClosedResourceError):
        await db.read(lambda tx: tx.value("SELECT 1"))


async def test_committed_writes_survive_reopening(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        await db.write(_insert, 7, "durable")
    async with open_database(database_url) as db:
        assert await db.read(_bodies) == {7: "durable"}


@pytest.mark.empty_database
async def test_migrations_apply_once(database_url: str) -> None:
    async with open_database(database_url) as db:
        first = await db.transaction(migrations.apply_pending)
        second = await db.transaction(migrations.apply_pending)
    assert first == [version for version, _ in migrations.available()]
    assert second == []


def _ids(tx: Tx, sql: str, params: dict[str, str]) -> list[int]:
    return [row["id"] for row in tx.all(sql, params)]


async def test_percent_signs_in_sql_and_parameters(database_url: str) -> None:
    async with open_database(database_url) as db:
        await db.transaction(_create_table)
        await db.write(_insert, 1, "100% done")
        await db.write(_insert, 2, "half")
        assert await db.read(_ids, "SELECT id FROM notes WHERE body LIKE '%done'", {}) == [1]
        pattern = {"pattern": "100%"}
        assert await db.read(_ids, "SELECT id FROM notes WHERE body LIKE :pattern", pattern) == [1]


def test_named_parameters_become_pyformat() -> None:
    sql = "SELECT :a FROM t WHERE x LIKE '%a' AND y = :long_name_2 AND z = 'x'::text"
    assert to_pyformat(sql) == (
        "SELECT %(a)s FROM t WHERE x LIKE '%%a' AND y = %(long_name_2)s AND z = 'x'::text"
    )


async def test_a_deadlock_between_two_nodes_is_resolved_by_running_the_loser_again(
    postgres_url: str,
) -> None:
    """Two nodes lock the same rows in opposite orders; PostgreSQL undoes one transaction, which
    is run again once the other has committed, and both succeed."""
    barrier = threading.Barrier(2, timeout=10)
    waited: set[int] = set()

    def cross(tx: Tx, first: int, second: int) -> str:
        tx.execute("UPDATE notes SET body = 'locked' WHERE id = :id", {"id": first})
        if first not in waited:  # the first run meets the other node halfway; a rerun does not
            waited.add(first)
            barrier.wait()
        tx.execute("UPDATE notes SET body = 'crossed' WHERE id = :id", {"id": second})
        return "done"

    async with open_database(postgres_url) as one, open_database(postgres_url) as other:
        await one.transaction(_create_table)
        await one.write(_insert, 1, "one")
        await one.write(_insert, 2, "two")
        results: list[str] = []

        async def run(db: Database, first: int, second: int) -> None:
            results.append(await db.write(cross, first, second))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, one, 1, 2)
            nursery.start_soon(run, other, 2, 1)
        assert results == ["done", "done"]
        # One after the other: the second to commit wrote 'locked' to its first row last.
        assert sorted((await one.read(_bodies)).values()) == ["crossed", "locked"]


def test_new_ids_are_uuid7_in_the_order_they_were_made() -> None:
    # Time-ordered ids keep a batch's rows on the last pages of every index (a commit of
    # random ids wrote a page per row and index): what took batch sends from ~5,000 to
    # ~10,000 emails/s on SQLite.
    before = time.time_ns() // 1_000_000
    made = [new_id() for _ in range(2000)]
    after = time.time_ns() // 1_000_000
    parsed = [uuid.UUID(i) for i in made]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in parsed)
    assert all(before <= u.int >> 80 <= after for u in parsed)
    assert [u.int >> 80 for u in parsed] == sorted(u.int >> 80 for u in parsed)
    assert len(set(made)) == len(made)


@given(
    st.datetimes(
        min_value=datetime(1000, 1, 2),
        max_value=datetime(9999, 12, 30),
        timezones=st.sampled_from([UTC, timezone(timedelta(hours=5, minutes=30)), timezone.min]),
    )
)
def test_stored_timestamps_are_fixed_width_utc_text_that_sorts_as_time(at: datetime) -> None:
    # The stored form is compared as text by both engines: it must be the instant in UTC,
    # always 27 characters, whatever zone the value came in.
    text = timestamp(at)
    assert text == at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ") and len(text) == 27
    assert parse_timestamp(text) == at
    later = at + timedelta(microseconds=1)
    assert timestamp(later) > text


def _recipients_in(tx: Tx, rows: list[tuple[str, str]]) -> None:
    """A bare email_recipients table of (domain, status) rows, with the delivery index."""
    tx.execute(
        "CREATE TABLE email_recipients (email_id TEXT, address TEXT, domain TEXT, status TEXT,"
        " next_attempt_at TEXT)"
    )
    tx.execute("CREATE INDEX due ON email_recipients (status, domain, next_attempt_at)")
    tx.execute_many(
        "INSERT INTO email_recipients VALUES (:id, 'a', :domain, :status, NULL)",
        [{"id": str(i), "domain": d, "status": s} for i, (d, s) in enumerate(rows)],
    )


@pytest.mark.empty_database
async def test_domains_with_work_are_those_with_queued_or_deferred_recipients(
    database_url: str,
) -> None:
    rows = [(f"d{i % 7}.example", "delivered") for i in range(50)]
    rows += [("q.example", "queued")] * 3 + [("d.example", "deferred"), ("both.example", "queued")]
    rows += [("both.example", "deferred"), ("b.example", "bounced"), ("f.example", "failed")]
    async with open_database(database_url) as db:
        await db.transaction(_recipients_in, rows)
        found = await db.read(emails.domains_with_work)
    assert sorted(found) == ["both.example", "d.example", "q.example"]


def _announce(tx: Tx, topic: str) -> None:
    tx.notify(topic)


def _signal_rows(tx: Tx) -> int:
    return len(tx.all("SELECT seq FROM _signals"))


async def test_sqlite_processes_hear_each_others_mail_and_the_signals_stay_bounded(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes on one SQLite file, as `serve --workers N` runs them: mail an intake
    worker accepts reaches the delivery worker, and the table that carries it is trimmed."""
    monkeypatch.setattr("storage.engines._SIGNALS_KEPT", 10)
    url = f"sqlite:///{tmp_path / 'shared.db'}"
    heard: set[str] = set()
    async with open_database(url) as intake, open_database(url) as delivery:
        intake.on_commit(lambda topics: None, "intake-node")
        delivery.on_commit(lambda topics: None, "delivery-node")
        async with trio.open_nursery() as nursery:
            news, arriving = trio.open_memory_channel[set[str]](100)
            nursery.start_soon(delivery.listen, news.send_nowait)
            await trio.sleep(0.2)  # listening from here on
            for n in range(25):
                await intake.write(_announce, f"mail:d{n}.example")
                with trio.fail_after(5):  # heard within a poll
                    while f"mail:d{n}.example" not in heard:
                        heard |= await arriving.receive()
            nursery.cancel_scope.cancel()
        assert 10 <= await intake.read(_signal_rows) <= 20


def _create_blobs(tx: Tx) -> None:
    kind = "BLOB" if tx.dialect == "sqlite" else "BYTEA"
    tx.execute(f"CREATE TABLE blobs (id TEXT PRIMARY KEY, data {kind} NOT NULL)")


def _store_blob(tx: Tx, blob_id: str, data: bytes) -> None:
    inline = tx.inline_octets(data)
    tx.execute(
        "INSERT INTO blobs (id, data) VALUES (:id, :data)",
        {"id": blob_id, "data": data if inline else b""},
    )
    if not inline:
        tx.write_octets("blobs", "data", "id", blob_id, data)


def _blob(tx: Tx, blob_id: str) -> bytes | None:
    row = tx.octets("SELECT data FROM blobs WHERE id = :id", {"id": blob_id})
    return None if row is None else bytes(row["data"])


async def test_large_values_are_stored_in_pieces_byte_for_byte(database_url: str) -> None:
    # Past 1 MiB a value is written in pieces (SQLite blob I/O, PostgreSQL binary COPY):
    # a large message is never bound whole (issue 28). Two in one unit, one in another.
    large = [bytes(range(256)) * (5 * 4096) + b"\r\n.\r\n", b"\0\xff" * (3 * 1024 * 1024 + 1)]
    async with open_database(database_url) as db:
        await db.transaction(_create_blobs)

        def store_two(tx: Tx) -> None:
            _store_blob(tx, "a", large[0])
            _store_blob(tx, "b", large[1])

        await db.write(store_two)
        await db.write(_store_blob, "c", large[0][::-1])
        assert await db.read(_blob, "a") == large[0]
        assert await db.read(_blob, "b") == large[1]
        assert await db.read(_blob, "c") == large[0][::-1]


@in_one_snapshot
def _rows_and_total(tx: Tx, pause: threading.Event, go_on: threading.Event) -> tuple[int, int]:
    rows = len(tx.all("SELECT id FROM notes"))
    pause.set()  # another connection inserts a row now
    go_on.wait(10)
    return rows, int(tx.value("SELECT COUNT(*) FROM notes"))


async def test_a_unit_marked_in_one_snapshot_sees_no_write_between_its_statements(
    postgres_url: str,
) -> None:
    """Rows and their total (a paged read) agree although a write commits between the two
    statements: the unit reads one REPEATABLE READ snapshot on PostgreSQL."""
    pause, go_on = threading.Event(), threading.Event()
    async with open_database(postgres_url) as db:
        await db.transaction(_create_table)
        await db.write(_insert, 1, "one")
        async with trio.open_nursery() as nursery:
            seen: list[tuple[int, int]] = []

            async def read() -> None:
                seen.append(await db.read(_rows_and_total, pause, go_on))

            nursery.start_soon(read)
            await trio.to_thread.run_sync(pause.wait, 10)
            async with open_database(postgres_url) as other:
                await other.write(_insert, 2, "two")
            go_on.set()
        assert seen == [(1, 1)]


def _email_with_two_recipients(tx: Tx, now: datetime) -> str:
    user = accounts.User(new_id(), "owner@example.org", "-", False, now)
    workspace = accounts.Workspace(new_id(), "Team", "business", user.id, now)
    accounts.insert_user(tx, user)
    accounts.insert_workspace(tx, workspace)
    email = emails.Email(
        id=new_id(), workspace_id=workspace.id, domain_id="dom_1",
        from_address="news@sender.example", from_name=None, to=[], cc=[], bcc=[],
        reply_to=None, subject="Issue 1", html=None, text="Hello.", headers={}, tags=[],
        attachments=[], status="sending", source="api", message_id="<1@sender.example>",
        rejection_reason=None, retry_of_id=None, send_at=None, created_at=now,
        updated_at=now, delivered_at=None,
    )  # fmt: skip
    recipients = [
        emails.Recipient(email.id, f"reader@{domain}", "to", domain, "queued", 0, now, None, now)
        for domain in ("one.example", "two.example")
    ]
    emails.insert(tx, [email], recipients, [], announce=False)
    return email.id


def _delivered(tx: Tx, email_id: str, domain: str, now: datetime) -> None:
    update = emails.RecipientUpdate(email_id, f"reader@{domain}", "delivered", None, "250 OK")
    delivery.record_outcomes(tx, [update], [], [], now, statuses.SUMMARISE)


def _both_delivered_at_once(url: str, email_id: str, now: datetime) -> None:
    """Node one writes its recipient's outcome; node two writes the other's until it waits on
    a lock node one holds; then node one commits, and node two after it."""
    import psycopg
    from psycopg.rows import dict_row

    first = psycopg.connect(url, row_factory=dict_row)
    second = psycopg.connect(url, row_factory=dict_row)
    watcher = psycopg.connect(url, autocommit=True)
    try:
        _delivered(Tx(first, "postgresql", NO_MASTER_KEY), email_id, "one.example", now)

        def other_node() -> None:
            _delivered(Tx(second, "postgresql", NO_MASTER_KEY), email_id, "two.example", now)
            second.commit()

        thread = threading.Thread(target=other_node)
        thread.start()
        waiting = "SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s"
        deadline = time.monotonic() + 10
        while watcher.execute(waiting, (second.info.backend_pid,)).fetchone() != ("Lock",):
            assert time.monotonic() < deadline, "the second write never waited for the first"
            time.sleep(0.01)
        first.commit()
        thread.join(10)
        assert not thread.is_alive()
    finally:
        for conn in (first, second, watcher):
            conn.close()


async def test_two_nodes_writing_outcomes_of_one_email_at_once_sum_up_all_of_them() -> None:
    """Two nodes deliver one email's two recipients and write their outcomes at once: the
    email is delivered, not left `sending` by the node that summed up its recipients without
    the other's outcome (it waits for the first node's commit, then reads both)."""
    now = datetime.now(UTC)
    with fresh_postgres_database(migrated=True) as url:
        async with open_database(url) as db:
            email_id = await db.write(_email_with_two_recipients, now)
            await trio.to_thread.run_sync(_both_delivered_at_once, url, email_id, now)
            status = await db.read(
                lambda tx: tx.value("SELECT status FROM emails WHERE id = :id", {"id": email_id})
            )
            assert status == "delivered"
