"""Several `postroom serve` nodes on one database, as child processes: the chaos test's and
`bench/cluster.py`'s cluster.

Every node gets ports of its own and the same database (PostgreSQL, or one SQLite file),
master key file, DNS server and delivery port; a node can be killed (SIGKILL, as a crash),
stopped cleanly (SIGTERM), paused and resumed (SIGSTOP, SIGCONT: a stall) and started again as
a new process. What the nodes hold is read straight from the database, so a test can bound
what a kill may cause to be sent twice.
"""

from __future__ import annotations

import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psycopg
import trio

from tests.harness.dns_server import DnsServer
from tests.harness.service import REPO, SMTP_HOST, free_port, wait_until_healthy
from tests.harness.smtp_sink import SmtpSink


@dataclass
class Node:
    """One `postroom serve` child process and the settings it runs with."""

    env: dict[str, str]
    cwd: Path
    process: subprocess.Popen[bytes] | None = None
    log: Path | None = None
    # `serve --workers`: one process (one pid) per node unless a test says; None: no such
    # option (an earlier release's `serve`, tests/test_upgrade.py).
    workers: int | None = 1

    @property
    def url(self) -> str:
        return "http://" + self.env["POSTROOM_API_LISTEN"]

    @property
    def pid(self) -> int:
        assert self.process is not None
        return self.process.pid

    def start(self) -> None:
        """Start the process and wait until it answers /healthz."""
        self.log = self.cwd / f"node-{self.env['POSTROOM_API_LISTEN'].rsplit(':', 1)[1]}.log"
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "postroom", "serve"]
                + ([] if self.workers is None else ["--workers", str(self.workers)]),
                env=self.env,
                cwd=self.cwd,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        wait_until_healthy(self.process, self.url, self.log.read_text)

    def kill(self) -> None:
        """SIGKILL: the node dies as in a crash, holding whatever it held."""
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def pause(self) -> None:
        """SIGSTOP: the node stalls (a GC pause, a frozen VM) holding what it holds."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT: the stalled node runs on from where it stopped."""
        assert self.process is not None
        self.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None


def database_rows(database_url: str, query: str) -> list[tuple[object, ...]]:
    """The rows of `query`, read straight from the database the nodes run on."""
    if database_url.startswith("sqlite:///"):
        lite = sqlite3.connect(database_url.removeprefix("sqlite:///"), timeout=30)
        try:
            return lite.execute(query).fetchall()
        finally:
            lite.close()
    with psycopg.connect(database_url) as conn:
        return conn.execute(query).fetchall()


@dataclass
class Cluster:
    database_url: str
    nodes: list[Node] = field(default_factory=list)

    def cli(self, *args: str) -> str:
        """A `postroom` subcommand against the cluster's database; its output."""
        node = self.nodes[0]
        done = subprocess.run(
            [sys.executable, "-m", "postroom", *args],
            env=node.env,
            cwd=node.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout

    def _rows(self, query: str) -> list[tuple[object, ...]]:
        return database_rows(self.database_url, query)

    def unsettled(self) -> int:
        """Recipients not delivered yet, or still leased by a node."""
        rows = self._rows(
            "SELECT COUNT(*) FROM email_recipients WHERE status <> 'delivered'"
            " OR leased_by IS NOT NULL"
        )
        return int(str(rows[0][0]))

    def held_by_process(self) -> dict[int, set[tuple[str, str]]]:
        """The recipients (email id, address) each live node process holds now, by pid."""
        rows = self._rows(
            "SELECT leased_by, email_id, address FROM email_recipients"
            " WHERE leased_by IS NOT NULL AND status IN ('queued', 'deferred')"
        )
        held: dict[int, set[tuple[str, str]]] = {}
        for node_id, email_id, address in rows:
            assert isinstance(node_id, str) and isinstance(email_id, str)
            assert isinstance(address, str)
            pid = int(node_id.split("/")[1])  # ids read host/pid/random (engine/platform/nodes.py)
            held.setdefault(pid, set()).add((email_id, address))
        return held


def node_env(
    database_url: str,
    cwd: Path,
    *,
    dns_nameserver: str,
    delivery_port: int,
    extra: dict[str, str] | None = None,
) -> dict[str, str]:
    """The settings of one node: its own ports, the cluster's database and key file."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env.update(
        {
            "POSTROOM_DATABASE_URL": database_url,
            "POSTROOM_API_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SMTP_HOST": SMTP_HOST,
            "POSTROOM_DNS_SERVERS": dns_nameserver,
            "POSTROOM_DELIVERY_PORT": str(delivery_port),
            "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
            "POSTROOM_SECRET_KEY_FILE": str(cwd / "secret.key"),
            "POSTROOM_SPOOL_DIR": str(cwd / "spool"),
            "POSTROOM_LOG_FORMAT": "text",
            "PYTHONPATH": str(REPO),
        }
    )
    env.update(extra or {})
    return env


@contextmanager
def running_cluster(
    size: int,
    database_url: str,
    cwd: Path,
    *,
    dns_nameserver: str,
    delivery_port: int,
    extra: dict[str, str] | None = None,
) -> Iterator[Cluster]:
    """`size` nodes started on one database (the first alone, so it migrates and writes the
    key file), stopped with SIGTERM at the end."""
    cluster = Cluster(database_url)
    try:
        for _ in range(size):
            env = node_env(
                database_url,
                cwd,
                dns_nameserver=dns_nameserver,
                delivery_port=delivery_port,
                extra=extra,
            )
            node = Node(env, cwd)
            cluster.nodes.append(node)
            node.start()
        yield cluster
    finally:
        for node in cluster.nodes:
            node.stop()


SENDER_DOMAIN = "sender.example"
SENDER = f"news@{SENDER_DOMAIN}"
_MESSAGE_ID = re.compile(rb"^Message-ID: (<[^>]+>)", re.M | re.I)


async def prepare_account(
    cluster: Cluster,
    dns_server: DnsServer,
    recipient_domains: list[str],
    webhook_url: str | None,
    plan: str = "business",
) -> str:
    """An account (Business unless `plan`) with a verified domain, a sender and (when given) a
    webhook for `email.delivered`; the recipient domains routed to 127.0.0.1. Its API key."""
    created = cluster.cli(
        "accounts", "create", "--email", "ops@example.org", "--password", "x" * 16,
        "--plan", plan,
    )  # fmt: skip
    key = str(json.loads(created)["api_key"])
    async with httpx.AsyncClient(
        base_url=cluster.nodes[0].url, headers={"Authorization": f"Bearer {key}"}, timeout=30
    ) as client:
        made = await client.post("/v1/domains/", json={"name": SENDER_DOMAIN})
        assert made.status_code == 201, made.text  # once, in a full suite, it was not
        domain = made.json()
        dkim = next(r for r in domain["dns_records"] if r["purpose"] == "dkim")
        dns_server.set(dkim["host"], "TXT", [dkim["value"]])
        verified = await client.post(f"/v1/domains/{domain['id']}/verify")
        assert verified.json()["status"] == "verified", verified.text
        assert (await client.post("/v1/senders/", json={"email": SENDER})).status_code == 201
        if webhook_url is not None:
            hook = {"url": webhook_url, "events": ["email.delivered"]}
            assert (await client.post("/v1/webhooks/", json=hook)).status_code == 201
    for domain in recipient_domains:
        dns_server.set(domain, "MX", [f"10 mx.{domain}."])
        dns_server.set(f"mx.{domain}", "A", ["127.0.0.1"])
    return key


async def send_emails(
    cluster: Cluster, key: str, count: int, recipient_domains: list[str], *, first: int = 0
) -> dict[str, str]:
    """Send `count` emails through the live nodes in turn, to the recipient domains in turn;
    Message-ID -> email id."""
    accepted: dict[str, str] = {}
    limiter = trio.CapacityLimiter(12)
    live = [node for node in cluster.nodes if node.alive]
    headers = {"Authorization": f"Bearer {key}"}
    clients = [httpx.AsyncClient(base_url=n.url, headers=headers, timeout=30) for n in live]

    async def send(i: int) -> None:
        body = {
            "from_": {"email": SENDER},
            "to": [{"email": f"reader{i}@{recipient_domains[i % len(recipient_domains)]}"}],
            "subject": f"Issue {i}",
            "text": "Hello.",
        }
        async with limiter:
            response = await clients[i % len(clients)].post("/v1/emails/", json=body)
        assert response.status_code == 202, response.text
        accepted[response.json()["message_id"]] = response.json()["id"]

    try:
        async with trio.open_nursery() as nursery:
            for i in range(first, first + count):
                nursery.start_soon(send, i)
    finally:
        for client in clients:
            await client.aclose()
    return accepted


def arrivals(sink: SmtpSink) -> list[tuple[str, float]]:
    """(Message-ID, arrival time) of every message the sink accepted, duplicates included."""
    found = []
    for message in sink.messages:
        match = _MESSAGE_ID.search(message.data)
        if match:
            found.append((match.group(1).decode(), message.received_at))
    return found


async def until_arrived(sink: SmtpSink, wanted: set[str], timeout: float) -> None:  # noqa: ASYNC109
    """Wait until every Message-ID in `wanted` has arrived at the sink."""
    with trio.fail_after(timeout):
        while True:
            if wanted <= {mid for mid, _ in arrivals(sink)}:
                return
            await trio.sleep(0.1)
