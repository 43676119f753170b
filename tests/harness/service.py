"""Postroom itself as a test peer: in-process on free ports, or as a subprocess.

`database_url` is parametrised over SQLite and PostgreSQL, so every test that uses the
service runs on both engines. PostgreSQL tests create a database of their own and drop it
afterwards; they are skipped, saying why, when POSTROOM_TEST_POSTGRES is not set (the test
command sets it whenever PostgreSQL is installed).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import hashlib
import itertools
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
import trio
import trio.testing

from engine.accounts import users as accounts
from postroom import config
from postroom.service import RunningService, serve
from storage import migrations
from storage.engines import open_engine
from tests.harness.dns_server import DnsServer
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority

POSTGRES_ENV = "POSTROOM_TEST_POSTGRES"
PUBLIC_URL = "http://postroom.test"
SMTP_HOST = "mx.postroom.test"
# Advisory lock on the PostgreSQL template: clones hold it shared, the process building it alone.
_TEMPLATE_LOCK = 7_201_2
_OTHER_TEMPLATES_KEPT = 8  # other schemas' newest templates, left for their runs
REPO = Path(__file__).resolve().parents[2]
# Seconds a `postroom serve` process gets to answer /healthz: generous, since a busy 2-core
# machine running four test workers can take that long to start several processes.
START_TIMEOUT = 90.0
SETTLE_TIMEOUT = 15.0  # seconds `Service.settled` waits, as the sending helpers' waits do


def _postgres_admin_url() -> str | None:
    return os.environ.get(POSTGRES_ENV) or None


def _schema_digest() -> str:
    """Names a migrated template after the migrations it holds: a changed schema gets a new one."""
    return hashlib.sha256(repr(migrations.available()).encode()).hexdigest()[:12]


def _migrate(url: str) -> None:
    engine = open_engine(url)
    try:
        engine.transaction(migrations.apply_pending, ())
    finally:
        engine.close()


def _clone_postgres_template(admin_url: str, clone: str) -> None:
    """Create `clone` from a database with every migration applied, made once for all test
    processes: cloning it is the cost of an empty database, where migrating each test's own
    took about as long again.

    Clones hold the lock shared, so test processes clone side by side (with the lock held
    alone they queued one behind another), while a builder holds it alone: a run of another
    checkout (another schema) never drops the template between a clone's check and its use."""
    name = _template_name()
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock_shared(%s)", (_TEMPLATE_LOCK,))
        try:
            if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
                conn.execute("SELECT pg_advisory_unlock_shared(%s)", (_TEMPLATE_LOCK,))
                conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
                try:
                    _build_postgres_template(conn, admin_url, name)
                finally:  # shared again, for the clone, before another builder can come in
                    conn.execute("SELECT pg_advisory_lock_shared(%s)", (_TEMPLATE_LOCK,))
                    conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
            conn.execute(f"CREATE DATABASE {clone} TEMPLATE {name}")
        finally:
            conn.execute("SELECT pg_advisory_unlock_shared(%s)", (_TEMPLATE_LOCK,))


def _template_name() -> str:
    return "postroom_template_" + _schema_digest()


def _build_postgres_template(conn: psycopg.Connection[Any], admin_url: str, name: str) -> None:
    """Build the migrated template `name` unless it exists (the caller holds the lock alone),
    and drop other schemas' templates that no run is cloning."""
    base, _, _ = admin_url.rpartition("/")
    if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
        return  # another process built it while this one waited for the lock
    building = name + "_building"
    conn.execute(f"DROP DATABASE IF EXISTS {building} WITH (FORCE)")  # a killed run's
    conn.execute(f"CREATE DATABASE {building}")
    _migrate(f"{base}/{building}")
    conn.execute(f"ALTER DATABASE {building} RENAME TO {name}")
    # Other schemas' templates but the newest few (by oid): checkouts tested at once on one
    # server (a branch each) would otherwise drop each other's, each rebuilding its own.
    stale = conn.execute(
        "SELECT datname FROM pg_database WHERE datname LIKE 'postroom\\_template\\_%%'"
        " AND datname <> %s ORDER BY oid DESC OFFSET %s",
        (name, _OTHER_TEMPLATES_KEPT),
    ).fetchall()
    for (old,) in stale:  # an older schema's, unless a run of another checkout uses it
        with contextlib.suppress(psycopg.errors.ObjectInUse):
            conn.execute(f"DROP DATABASE IF EXISTS {old}")


@functools.cache
def _sqlite_template() -> Path:
    """A migrated SQLite file to copy, made once per test process."""
    path = Path(tempfile.mkdtemp(prefix="postroom-template-")) / "postroom.db"
    _migrate(f"sqlite:///{path}")
    return path


@contextmanager
def fresh_postgres_database(*, migrated: bool = False) -> Iterator[str]:
    """A new PostgreSQL database, empty or with every migration applied, dropped afterwards;
    skips the test when PostgreSQL is not configured."""
    admin_url = _postgres_admin_url()
    if admin_url is None:
        pytest.skip(f"PostgreSQL not configured ({POSTGRES_ENV} unset): SQLite only")
    name = "postroom_test_" + secrets.token_hex(6)
    if migrated:
        _clone_postgres_template(admin_url, name)
    else:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
    base, _, _ = admin_url.rpartition("/")
    try:
        yield f"{base}/{name}"
    finally:
        _dropping.append(_DROPS.submit(_drop_postgres_database, admin_url, name))


# DROP DATABASE waits for a checkpoint (0.5-0.8 s here, more under load): a test's database is
# dropped on threads of the test process, so the next test does not wait for it, and several
# drops at once share the checkpoint they wait for.
_DROPS = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="drop-db")
_dropping: list[concurrent.futures.Future[None]] = []


def _drop_postgres_database(admin_url: str, name: str) -> None:
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")


@pytest.fixture(autouse=True, scope="session")
def postgres_databases_dropped() -> Iterator[None]:
    """At the end of the test process, every test database dropped (a failed drop shows)."""
    yield
    _DROPS.shutdown(wait=True)
    for dropped in _dropping:
        dropped.result()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A fresh database on each engine, with every migration applied (startup then finds
    nothing to do); empty for a test marked `empty_database`."""
    migrated = request.node.get_closest_marker("empty_database") is None
    if request.param == "sqlite":
        path = tmp_path / "postroom.db"
        if migrated:
            shutil.copyfile(_sqlite_template(), path)
        yield f"sqlite:///{path}"
        return
    with fresh_postgres_database(migrated=migrated) as url:
        yield url


@pytest.fixture
def postgres_url() -> Iterator[str]:
    """A fresh, empty PostgreSQL database (for what only PostgreSQL can do: several hosts)."""
    with fresh_postgres_database() as url:
        yield url


@pytest.fixture
def clock() -> trio.testing.MockClock:
    """Virtual time that runs at real speed and can be jumped forward (`clock.jump`)."""
    return trio.testing.MockClock(rate=1.0)


def test_settings(
    database_url: str, dns: DnsServer | None = None, **overrides: str
) -> config.Settings:
    env = {
        "POSTROOM_DATABASE_URL": database_url,
        "POSTROOM_API_LISTEN": "127.0.0.1:0",
        "POSTROOM_SUBMISSION_LISTEN": "127.0.0.1:0",
        "POSTROOM_INBOUND_LISTEN": "127.0.0.1:0",
        "POSTROOM_SMTP_HOST": SMTP_HOST,
        "POSTROOM_SMTP_PORT": "587",  # what credentials say; the relay's own port is ephemeral
        "POSTROOM_PUBLIC_URL": PUBLIC_URL,
        "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
        # One master key per database, kept out of the checkout (for PostgreSQL the default
        # would be ./postroom-data/secret.key, shared by every test).
        "POSTROOM_SECRET_KEY_FILE": str(
            Path(tempfile.gettempdir())
            / "postroom-test-keys"
            / (hashlib.sha256(database_url.encode()).hexdigest()[:24] + ".key")
        ),
        # And its own spool (a stop during an outage saves the outcomes it kept there).
        "POSTROOM_SPOOL_DIR": str(
            Path(tempfile.gettempdir())
            / "postroom-test-spool"
            / hashlib.sha256(database_url.encode()).hexdigest()[:24]
        ),
    }
    if dns is not None:
        env["POSTROOM_DNS_SERVERS"] = dns.nameserver
    env.update({"POSTROOM_" + k.upper(): v for k, v in overrides.items()})
    return config.load(env)


@dataclass
class Account:
    """A user with a workspace and an API key, plus a client that sends that key."""

    user_id: str
    workspace_id: str
    email: str
    password: str
    plan: str
    api_key: str
    client: httpx.AsyncClient


@dataclass
class Service:
    """A running in-process service and helpers to act on it as its users."""

    running: RunningService
    _clock: trio.testing.MockClock
    _clients: list[httpx.AsyncClient] = field(default_factory=list)

    @property
    def clock(self) -> trio.testing.MockClock:
        """The virtual clock driving the service; the test must take `clock` as an argument."""
        # pytest-trio runs a test under a clock only when the test function itself asks for
        # it, so a jump would otherwise do nothing and a time test would pass vacuously.
        if trio.lowlevel.current_clock() is not self._clock:
            raise RuntimeError("add the `clock` fixture to the test's arguments to move time")
        return self._clock

    @property
    def url(self) -> str:
        return self.running.api_url

    @property
    def submission_address(self) -> tuple[str, int]:
        """The SMTP relay (STARTTLS with the ``tls_ca`` loopback certificate, then AUTH)."""
        return self.running.submission_address

    @property
    def inbound_address(self) -> tuple[str, int]:
        """The inbound MX (STARTTLS with the ``tls_ca`` loopback certificate)."""
        return self.running.inbound_address

    def client(self, **kwargs: Any) -> httpx.AsyncClient:
        """An HTTP client for the API, closed when the test ends.

        It opens a connection per request: a kept-alive connection left idle across a clock
        jump can be half-closed by the server's keep-alive timer while the client, whose pool
        expiry runs on real time, still reuses it and waits for an answer that never comes.
        """
        kwargs.setdefault("limits", httpx.Limits(max_keepalive_connections=0))
        kwargs.setdefault("verify", False)  # plain HTTP: loading a CA store cost 65 ms a client
        client = httpx.AsyncClient(base_url=self.url, timeout=30.0, **kwargs)
        self._clients.append(client)
        return client

    async def account(self, plan: str = "free", *, admin: bool = False) -> Account:
        """A new account created the way `postroom accounts create` does."""
        email = f"user-{secrets.token_hex(4)}@example.org"
        password = "correct horse battery staple"
        created = await accounts.create_account(self.running.runtime, email, password, plan, admin)
        client = self.client(headers={"Authorization": f"Bearer {created.api_key}"})
        return Account(
            created.user_id, created.workspace_id, email, password, plan, created.api_key, client
        )

    async def settled(self) -> None:
        """Return once what the test set off is done: the engine has nothing under way
        (`RunningService.idle`) and every task of the test's run (the service's, the peers')
        is waiting, twice in a row with no unit of work written between. Work due later (a
        retry, a scheduled email) is not waited for: the test moves the clock to it."""
        cushion = 0.01  # real seconds with no task to run and no I/O: a loopback send landed
        db = self.running.runtime.db
        with trio.fail_after(SETTLE_TIMEOUT):
            while True:
                await trio.testing.wait_all_tasks_blocked(cushion)
                if not self.running.idle():
                    continue
                written = db.writer_statistics().units
                await trio.testing.wait_all_tasks_blocked(cushion)
                if self.running.idle() and db.writer_statistics().units == written:
                    return

    async def aclose(self) -> None:
        for client in self._clients:
            await client.aclose()


@pytest.fixture
async def service(
    nursery: trio.Nursery,
    database_url: str,
    dns_server: DnsServer,
    smtp_sink: SmtpSink,
    tls_ca: TlsAuthority,
    clock: trio.testing.MockClock,
) -> AsyncIterator[Service]:
    """The whole service, in this process, on free ports, over a fresh database.

    Recipients' MX hosts are reached at the SMTP sink's port on whatever address the DNS
    server gives them (use 127.0.0.1).
    """
    # The relay and the inbound MX present the loopback certificate, so clients verify them
    # with `tls_ca.client_context()`.
    relay_pem = tls_ca.ca_file.parent / "relay-key-and-chain.pem"
    if not relay_pem.exists():
        tls_ca.server_cert.private_key_and_cert_chain_pem.write_to_path(str(relay_pem))
    settings = test_settings(
        database_url,
        dns_server,
        delivery_port=str(smtp_sink.port),
        extra_ca_file=str(tls_ca.ca_file),  # trusts the HTTPS receiver's certificate
        tls_cert=str(relay_pem),
        tls_key=str(relay_pem),
    )
    async with started(nursery, settings, clock) as service:
        yield service


@contextlib.asynccontextmanager
async def started(
    nursery: trio.Nursery, settings: config.Settings, clock: trio.testing.MockClock
) -> AsyncIterator[Service]:
    """The service with `settings` running in `nursery` until the block ends."""
    running: RunningService = await nursery.start(serve, settings)
    service = Service(running, clock)
    try:
        yield service
    finally:
        await service.aclose()
        running.stop()


# Ports for the processes tests start, each xdist worker its own block below Linux's
# ephemeral range (32768-60999). A port the kernel picks for bind(0) is free only until it is
# closed: another worker's bind(0), or any outgoing connection, could then take it before the
# child process listens on it, and the test would talk to another test's service.
_PORT_BLOCK = 2000
_PORT_BASE = 20000 + _PORT_BLOCK * int(
    os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or "0"
)
_next_port = itertools.count()


def free_port() -> int:
    """A loopback TCP port no listener holds, not handed out before by this process."""
    for _ in range(_PORT_BLOCK):
        port = _PORT_BASE + next(_next_port) % _PORT_BLOCK
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as listeners bind
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue  # a listener of this machine's (RabbitMQ's 25672, say)
            return port
    raise RuntimeError(f"no free port in {_PORT_BASE}-{_PORT_BASE + _PORT_BLOCK - 1}")


def wait_until_healthy(
    process: subprocess.Popen[bytes], url: str, output: Callable[[], str]
) -> None:
    """Wait until `postroom serve` in `process` answers `url`/healthz with 200 (START_TIMEOUT
    at most); `output()` says why when it exits first.

    One client asks every time: `httpx.get` makes a client per call, loading the CA store
    (26 ms of CPU here), so polling with it took a third of a core from the process starting.
    """
    deadline = time.monotonic() + START_TIMEOUT
    with httpx.Client(verify=False, timeout=1) as client:  # plain HTTP: no CA store
        while time.monotonic() < deadline:
            if process.poll() is not None:
                raise RuntimeError(f"postroom serve exited early:\n{output()}")
            try:
                if client.get(url + "/healthz").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
    raise RuntimeError(f"postroom serve did not answer on {url} in {START_TIMEOUT:.0f} s")


@dataclass
class ServiceProcess:
    """`postroom serve` in a child process, for restart and signal tests."""

    env: dict[str, str]
    cwd: Path
    process: subprocess.Popen[bytes] | None = None
    workers: int = 1  # `serve --workers`; one process unless a test is about workers
    serve_options: tuple[str, ...] = ()  # more options of `serve` (`--delivery-workers M`)

    @property
    def url(self) -> str:
        return "http://" + self.env["POSTROOM_API_LISTEN"]

    def cli(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run a `postroom` subcommand against the same settings."""
        return subprocess.run(
            [sys.executable, "-m", "postroom", *args],
            env=self.env,
            cwd=self.cwd,
            capture_output=True,
            text=True,
            timeout=60,
            check=check,
        )

    def start(self, *options: str, url: str | None = None) -> None:
        """`postroom [options] serve`, waited on until `url` (default: the API) is healthy."""
        url = url or self.url
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "postroom",
                *options,
                "serve",
                "--workers",
                str(self.workers),
                *self.serve_options,
            ],
            env=self.env,
            cwd=self.cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        wait_until_healthy(self.process, url, self.output)

    def signal(self, signum: signal.Signals) -> int:
        """Send a signal and wait for the process to end; its exit status."""
        assert self.process is not None
        self.process.send_signal(signum)
        return self.process.wait(timeout=30)

    def output(self) -> str:
        assert self.process is not None and self.process.stdout is not None
        return self.process.stdout.read().decode()

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=30)
        if self.process is not None and self.process.stdout is not None:
            self.process.stdout.close()


@pytest.fixture
def service_process(database_url: str, tmp_path: Path) -> Iterator[ServiceProcess]:
    """A not-yet-started `postroom serve` child process over a fresh database."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("POSTROOM_")}
    env.update(
        {
            "POSTROOM_DATABASE_URL": database_url,
            "POSTROOM_API_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SUBMISSION_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_INBOUND_LISTEN": f"127.0.0.1:{free_port()}",
            "POSTROOM_SMTP_HOST": SMTP_HOST,
            # Every peer of a test listens on loopback (as in `test_settings`).
            "POSTROOM_ALLOW_PRIVATE_TARGETS": "on",
            "PYTHONPATH": str(REPO),
        }
    )
    proc = ServiceProcess(env, tmp_path)
    try:
        yield proc
    finally:
        proc.stop()
