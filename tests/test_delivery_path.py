"""The delivery path on the wire and in the database: STARTTLS falling back to plain text,
sessions ending with QUIT, connections kept from one round to the next, and rounds loaded
and recorded with a fixed number of statements, on both engines."""

from __future__ import annotations

import re
import ssl
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import trio
from trio.testing import MockClock

from engine.delivery.domain_queue import Kept, Outcomes, _record, write_kept
from engine.delivery.full_mailboxes import FullMailboxes
from engine.platform import faults
from engine.sending import statuses as email_statuses
from engine.webhooks import outbox
from storage import delivery, emails, soft_bounces
from storage.codec import new_id, timestamp
from storage.emails import Event, RecipientUpdate
from storage.engines import pipelining
from storage.tx import Tx
from tests.harness.dns_server import DnsServer
from tests.harness.sending import message, ready_account, route_mail, wait_for_status
from tests.harness.service import Account, Service
from tests.harness.smtp_sink import SmtpSink


def _handshake_that_fails() -> ssl.SSLContext:
    """A server context with no certificate: STARTTLS is offered, every handshake fails."""
    return ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)


async def test_failed_starttls_is_retried_once_in_plain_text_and_delivers(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    smtp_sink.ssl_context = _handshake_that_fails()
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "oldtls.example")
    sent = (await account.client.post("/v1/emails/", json=message("o@oldtls.example"))).json()
    [received] = await smtp_sink.wait_for_messages(1)
    assert not received.tls
    assert (await wait_for_status(account, sent["id"]))["status"] == "delivered"
    assert smtp_sink.connections == 2  # the failed handshake, then the same host in plain text
    assert smtp_sink.transcript.count("STARTTLS") == 1


async def test_a_server_refusing_the_session_for_good_bounces_without_suppressing(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, nursery: trio.Nursery
) -> None:
    async def refuse(stream: trio.SocketStream) -> None:
        async with stream:
            await stream.send_all(b"554 5.7.1 no mail from your network\r\n")

    # Another loopback address, the port the service delivers to: an MX of its own.
    listeners = await trio.open_tcp_listeners(smtp_sink.port, host="127.0.0.2")
    nursery.start_soon(trio.serve_listeners, refuse, listeners)
    account = await ready_account(service, dns_server)
    dns_server.set("strict.example", "MX", ["10 mx.strict.example."])
    dns_server.set("mx.strict.example", "A", ["127.0.0.2"])
    sent = (await account.client.post("/v1/emails/", json=message("s@strict.example"))).json()
    email = await wait_for_status(account, sent["id"])
    assert email["status"] == "bounced"
    bounced = email["events"][-1]["metadata"]
    assert bounced["response"].endswith("554 5.7.1 no mail from your network")
    assert bounced["blame"] == "destination"
    # The destination refused us, not the address: it stays deliverable.
    listed = (await account.client.get("/v1/suppressions/")).json()["items"]
    assert listed == []


async def test_every_session_ends_with_quit(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink
) -> None:
    account = await ready_account(service, dns_server)
    route_mail(dns_server, "polite.example")
    sent = [
        (await account.client.post("/v1/emails/", json=message(f"p{i}@polite.example"))).json()
        for i in range(3)
    ]
    await smtp_sink.wait_for_messages(3)
    for email in sent:
        assert (await wait_for_status(account, email["id"]))["status"] == "delivered"
    with trio.fail_after(10):  # QUIT follows the round's outcomes
        while True:
            if smtp_sink.transcript.count("QUIT") == smtp_sink.connections:
                break
            await trio.sleep(0.02)
    assert smtp_sink.transcript[-1] == "QUIT"


async def test_connections_are_kept_from_one_round_to_the_next(
    service: Service, dns_server: DnsServer, smtp_sink: SmtpSink, clock: MockClock
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    route_mail(dns_server, "many.example")
    # Over one round's 200 recipients, all due at the same moment: the second round is
    # claimed and built while the first is on the wire, and goes on its connections.
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    for start, count in ((0, 100), (100, 100), (200, 20)):
        batch = [message(f"r{start + i}@many.example", send_at=send_at) for i in range(count)]
        response = await account.client.post("/v1/emails/batch", json=batch)
        assert response.status_code == 202, response.text
    clock.jump(3601)
    await smtp_sink.wait_for_messages(220, timeout=60)
    assert smtp_sink.most_open_transactions <= 4
    assert smtp_sink.connections <= 4


async def _schedule(account: Account, domain: str, count: int) -> list[str]:
    """`count` emails with two recipients each, scheduled an hour ahead (delivery leaves them
    alone until then)."""
    send_at = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
    ids = []
    for i in range(count):
        to = [f"a{i}@{domain}", f"b{i}@{domain}"]
        response = await account.client.post("/v1/emails/", json=message(to, send_at=send_at))
        assert response.status_code == 202, response.text
        ids.append(response.json()["id"])
    return ids


class _CountingTx:
    """A transaction that counts the statements run through it."""

    def __init__(self, tx: Tx) -> None:
        self._tx = tx
        self.dialect = tx.dialect
        self.sealer = tx.sealer
        self.statements = 0

    def notify(self, topic: str) -> None:
        self._tx.notify(topic)

    def row_lock(self, clause: str = "FOR UPDATE", *, when: bool = True) -> str:
        return self._tx.row_lock(clause, when=when)  # a clause, not a statement

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._tx, name)

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.statements += 1
            return method(*args, **kwargs)

        return counted


async def test_a_round_is_claimed_loaded_and_recorded_with_a_fixed_number_of_statements(
    service: Service, dns_server: DnsServer
) -> None:
    account = await ready_account(service, dns_server, plan="business")
    small = await _schedule(account, "few.example", 2)
    large = await _schedule(account, "many.example", 30)
    db = service.running.runtime.db
    late = datetime.now(UTC) + timedelta(minutes=5)  # suppressed after the email was accepted

    def suppress_one(tx: Tx) -> None:
        ws = tx.value("SELECT workspace_id FROM emails WHERE id = :id", {"id": large[3]})
        tx.execute(
            "INSERT INTO suppressions (workspace_id, email, reason, created_at)"
            " VALUES (:ws, 'b3@many.example', 'manual', :at)",
            {"ws": ws, "at": timestamp(late)},
        )

    await db.write(suppress_one)

    Counts = tuple[int, int, int, delivery.RoundData]

    def statements(domain: str) -> Callable[[Tx], Counts]:
        def unit(tx: Tx) -> Counts:
            counting = _CountingTx(tx)
            now = datetime.now(UTC) + timedelta(days=1)
            claimed, _ = emails.claim(
                counting,  # type: ignore[arg-type]
                domain,
                now,
                now + timedelta(seconds=30),
                "test-node",
                500,
            )
            after_claim = counting.statements
            data = delivery.load_round(counting, claimed)  # type: ignore[arg-type]
            after_load = counting.statements - after_claim
            updates = [
                RecipientUpdate(r.email_id, r.address, "deferred", now, "451 later")
                for r in claimed
            ]
            delivery.record_outcomes(
                counting,  # type: ignore[arg-type]
                updates,
                [],
                [],
                now,
                email_statuses.SUMMARISE,
            )
            return after_claim, after_load, counting.statements - after_claim - after_load, data

        return unit

    for domain, ids in (("few.example", small), ("many.example", large)):
        claim_n, load_n, record_n, data = await db.write(statements(domain))
        assert claim_n == 3  # SELECT, one UPDATE, the next due time
        assert load_n == 4  # emails, submitted messages, sending domains, suppressions
        # An UPDATE per outcome, events, (on PostgreSQL, the emails locked against another
        # node's outcomes,) a read and an UPDATE per status.
        assert record_n <= (5 if db.dialect == "postgresql" else 4)
        assert {email.id for email, _, _ in data.emails} == set(ids)
        assert all(domain is not None and domain.name for _, domain, _ in data.emails)
        late_ones = {email.id: found for email, _, found in data.emails if found}
        if ids is large:
            assert late_ones == {large[3]: {"b3@many.example": "manual"}}
        else:
            assert late_ones == {}

    def statuses(tx: Tx) -> list[dict[str, Any]]:
        return tx.all(
            "SELECT r.status AS recipient, e.status AS email FROM email_recipients r"
            " JOIN emails e ON e.id = r.email_id"
        )

    rows = await db.read(statuses)
    assert len(rows) == 64 and {(r["recipient"], r["email"]) for r in rows} == {
        ("deferred", "deferred")
    }


async def test_kept_outcomes_are_written_over_lost_leases_only_when_they_end_a_free_recipient(
    service: Service, dns_server: DnsServer
) -> None:
    """The fence for outcomes a node kept through a database outage (statuses.UNHELD): those
    of recipients it still holds are written as ever; of the others, only an outcome that
    ends a recipient no node holds and that still waits (a success over a re-delivery
    scheduled elsewhere), never one under way on another node or already done."""
    account = await ready_account(service, dns_server)
    ids = await _schedule(account, "kept.example", 3)
    db = service.running.runtime.db
    # (email, local part): (status, holder) as the database has it when the outcome is written.
    rows = {
        (0, "a"): ("queued", "this-node"),
        (0, "b"): ("queued", "this-node"),
        (1, "a"): ("queued", None),  # freed: this node was declared dead during the outage
        (1, "b"): ("deferred", None),
        (2, "a"): ("queued", "other-node"),  # freed and claimed by another node since
        (2, "b"): ("delivered", None),  # delivered by another node since
    }
    kept = {  # the outcome this node kept for each
        (0, "a"): "deferred",
        (0, "b"): "delivered",
        (1, "a"): "delivered",
        (1, "b"): "deferred",
        (2, "a"): "delivered",
        (2, "b"): "delivered",
    }
    written = {(0, "a"), (0, "b"), (1, "a")}

    def address(key: tuple[int, str]) -> str:
        return f"{key[1]}{key[0]}@kept.example"

    def prepare(tx: Tx) -> str:
        for (n, part), (status, holder) in rows.items():
            tx.execute(
                "UPDATE email_recipients SET status = :status, leased_by = :holder"
                " WHERE email_id = :id AND address = :address",
                {"status": status, "holder": holder, "id": ids[n], "address": address((n, part))},
            )
        return str(tx.value("SELECT workspace_id FROM emails WHERE id = :id", {"id": ids[0]}))

    workspace = await db.write(prepare)
    now = datetime.now(UTC)
    updates = [
        RecipientUpdate(ids[n], address((n, part)), status, None, "250 2.0.0 OK")
        for (n, part), status in kept.items()
    ]
    events = [
        emails.Event(new_id(), ids[n], workspace, status, address((n, part)), {}, now)
        for (n, part), status in kept.items()
    ]

    def write(tx: Tx) -> None:
        recorded = delivery.record_outcomes(
            tx,
            updates,
            events,
            [],
            now,
            email_statuses.SUMMARISE,
            holder="this-node",
            unheld=email_statuses.UNHELD,
        )
        outbox.queue(tx, recorded)

    await db.write(write)

    def found(tx: Tx) -> dict[tuple[int, str], tuple[str, int, str | None, int]]:
        result = {}
        for key in rows:
            params = {"id": ids[key[0]], "address": address(key)}
            row = tx.one(
                "SELECT status, attempts, leased_by FROM email_recipients"
                " WHERE email_id = :id AND address = :address",
                params,
            )
            recorded = tx.value(
                "SELECT COUNT(*) FROM email_events WHERE email_id = :id AND recipient = :address"
                " AND event_type IN ('delivered', 'deferred')",
                params,
            )
            assert row is not None
            result[key] = (row["status"], row["attempts"], row["leased_by"], int(recorded))
        return result

    assert await db.read(found) == {
        key: (kept[key], 1, None, 1) if key in written else (status, 0, holder, 0)
        for key, (status, holder) in rows.items()
    }


async def test_kept_mailbox_full_replies_count_only_for_recipients_the_fence_lets_through(
    service: Service, dns_server: DnsServer
) -> None:
    """A node kept two "mailbox full" deferrals through an outage; meanwhile another node
    took over one of the recipients. Only the one still held counts towards its address's
    mailbox-full tally (which bounces and suppresses an address once it runs out): the other
    outcome is fenced out, and its recipient's tally is the new holder's to keep."""
    account = await ready_account(service, dns_server)
    [email_id] = await _schedule(account, "full.example", 1)
    db = service.running.runtime.db
    held, taken = "a0@full.example", "b0@full.example"

    def prepare(tx: Tx) -> str:
        for address, holder in ((held, "this-node"), (taken, "other-node")):
            tx.execute(
                "UPDATE email_recipients SET leased_by = :holder"
                " WHERE email_id = :id AND address = :address",
                {"holder": holder, "id": email_id, "address": address},
            )
        return str(tx.value("SELECT workspace_id FROM emails WHERE id = :id", {"id": email_id}))

    workspace = await db.write(prepare)
    now = datetime.now(UTC)
    full = "452 4.2.2 Mailbox full"
    mailboxes = FullMailboxes()
    updates, events = [], []
    for n, address in enumerate((held, taken)):
        retry = now + timedelta(hours=1)
        updates.append(RecipientUpdate(email_id, address, "deferred", retry, full))
        meta = {"response": full}
        events.append(Event(new_id(), email_id, workspace, "deferred", address, meta, now))
        mailboxes.note_full(workspace, email_id, address, "queued", n, n)
    part = Outcomes(updates, events, [], now, {}, set(), mailboxes)
    await db.write(write_kept, [Kept("full.example", part, "this-node")], now)

    def tallies(tx: Tx) -> dict[str, int]:
        found = soft_bounces.read(tx, [(workspace, held), (workspace, taken)])
        return {address: counts[0] for (_, address), counts in found.items()}

    assert await db.read(tallies) == {held: 1}


async def test_a_round_that_raised_counts_faults_only_on_recipients_its_node_still_holds(
    service: Service, dns_server: DnsServer
) -> None:
    """A node declared dead while its round raised must not count a fault on (nor release,
    nor quarantine) a recipient another node holds now; its own still count."""
    account = await ready_account(service, dns_server)
    [email_id] = await _schedule(account, "faulted.example", 1)
    db = service.running.runtime.db
    holders = {"a0@faulted.example": "this-node", "b0@faulted.example": "other-node"}

    def prepare(tx: Tx) -> list[emails.Recipient]:
        for address, holder in holders.items():
            tx.execute(
                "UPDATE email_recipients SET leased_by = :holder"
                " WHERE email_id = :id AND address = :address",
                {"holder": holder, "id": email_id, "address": address},
            )
        return emails.recipients_of(tx, email_id)

    recipients = await db.write(prepare)
    now = datetime.now(UTC)
    quarantine = email_statuses.recipients_move(email_statuses.Trigger.GAVE_UP)

    def fault(tx: Tx) -> dict[str, tuple[int, str | None]]:
        emails.record_faults(
            tx,
            recipients,
            "boom",
            now,
            faults.policy(now),
            email_statuses.SUMMARISE,
            quarantine,
            "this-node",
        )
        rows = tx.all(
            "SELECT address, faults, leased_by FROM email_recipients WHERE email_id = :id",
            {"id": email_id},
        )
        return {row["address"]: (row["faults"], row["leased_by"]) for row in rows}

    assert await db.write(fault) == {
        "a0@faulted.example": (1, None),
        "b0@faulted.example": (0, "other-node"),
    }


async def test_a_write_holding_every_recipient_of_an_email_sums_it_up_without_reading_them(
    service: Service, dns_server: DnsServer
) -> None:
    """The outcome write learns from its own UPDATE how many recipients each email has: an
    email all of whose recipients it wrote (and holds locked) is summed up from what it
    wrote, with no lock and read of the recipients; one it wrote only some of is read."""
    account = await ready_account(service, dns_server)
    whole, partial = await _schedule(account, "whole.example", 2)
    db = service.running.runtime.db
    now = datetime.now(UTC) + timedelta(days=1)

    def write(tx: Tx, keys: list[tuple[str, str]]) -> int:
        emails.claim(tx, "whole.example", now, now + timedelta(seconds=30), "test-node", 500)
        counting = _CountingTx(tx)
        delivery.record_outcomes(
            counting,  # type: ignore[arg-type]
            [RecipientUpdate(e, a, "delivered", None, "250 2.0.0 OK") for e, a in keys],
            [],
            [],
            now,
            email_statuses.SUMMARISE,
            holder="test-node",
        )
        return counting.statements

    # Both recipients of one email: the UPDATE, the events, the email's UPDATE.
    both = [(whole, "a0@whole.example"), (whole, "b0@whole.example")]
    assert await db.write(write, both) == 3
    # One of the other's two: its recipients are read (and on PostgreSQL locked first).
    one = [(partial, "a1@whole.example")]
    assert await db.write(write, one) == (5 if db.dialect == "postgresql" else 4)

    def statuses(tx: Tx) -> dict[str, str]:
        rows = tx.all(
            "SELECT id, status FROM emails WHERE id IN (:a, :b)", {"a": whole, "b": partial}
        )
        return {row["id"]: row["status"] for row in rows}

    found = await db.read(statuses)
    assert found[whole] == "delivered"
    assert found[partial] not in ("delivered", "scheduled")  # one delivered, one still waiting


async def test_the_outcome_write_reads_its_webhooks_with_its_recipients_in_one_round_trip(
    service: Service, dns_server: DnsServer, tmp_path: Path
) -> None:
    """The delivery's outcome write waits on the database once before its COMMIT on
    PostgreSQL: the webhooks its events go to are asked for ahead and come back with the
    recipients' UPDATE (a round trip per write was a tenth of the delivery's time under
    load). Each delivered event still gets its webhook delivery, on both engines."""
    account = await ready_account(service, dns_server)
    hook = {"url": "https://hooks.example.net/hook", "events": ["email.delivered"]}
    assert (await account.client.post("/v1/webhooks/", json=hook)).status_code == 201
    ids = await _schedule(account, "hooked.example", 2)
    db = service.running.runtime.db
    now = datetime.now(UTC) + timedelta(days=1)

    def claim(tx: Tx) -> list[tuple[str, str, str]]:
        claimed, _ = emails.claim(
            tx, "hooked.example", now, now + timedelta(seconds=30), "test-node", 500
        )
        ws = tx.value("SELECT workspace_id FROM emails WHERE id = :id", {"id": ids[0]})
        return [(r.email_id, r.address, ws) for r in claimed]

    claimed = await db.write(claim)
    assert len(claimed) == 4
    part = Outcomes(
        [RecipientUpdate(e, a, "delivered", None, "250 2.0.0 OK") for e, a, _ in claimed],
        [Event(new_id(), e, ws, "delivered", a, {}, now) for e, a, ws in claimed],
        [],
        now,
        {},
        set(),
        FullMailboxes(),
    )
    trace = tmp_path / "libpq.trace"

    @pipelining
    def write(tx: Tx) -> None:
        if tx.dialect != "postgresql":
            _record(tx, part, "hooked.example", [], "test-node")
            return
        pgconn = tx._conn.pgconn  # libpq's own trace: what goes to the server, and when
        with trace.open("w") as out:
            pgconn.trace(out.fileno())
            try:
                _record(tx, part, "hooked.example", [], "test-node")
            finally:
                pgconn.untrace()

    # In a transaction of its own, as when alone in the writer's batch: through `db.write` a
    # write of the service's (its heartbeat) sometimes shared the batch, where a unit runs
    # unpipelined by design (storage/engines.py `pipelining`).
    await db.transaction(write)
    if db.dialect == "postgresql":
        # Each Flush or Sync the client sends, it waits for what it asked.
        waits = re.findall(r"\tF\t\d+\t(?:Flush|Sync)$", trace.read_text(), re.MULTILINE)
        assert len(waits) == 1, trace.read_text()

    def deliveries(tx: Tx) -> int:
        return int(tx.value("SELECT COUNT(*) FROM webhook_deliveries"))

    assert await db.read(deliveries) == 4
