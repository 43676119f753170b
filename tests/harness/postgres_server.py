"""A PostgreSQL server of a test's own, to crash and start again under the service.

The shared test server is never touched: this one is made with the installed `initdb` in a
temporary folder and run with `pg_ctl` on a free loopback port, as the `postgres` OS user
(the server refuses to run as root). `crash` is `pg_ctl stop -m immediate`, what a power cut
of the database host looks like to its clients: every connection drops, nothing is shut down
cleanly, and the next start recovers from the WAL. Durability across the host's own crashes is
not tested here, so the server does not fsync (a crash of the server alone loses nothing).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psycopg
import pytest

from tests.harness.service import free_port

OS_USER = "postgres"
START_ATTEMPTS = 3


def _bin_dir() -> Path | None:
    """The newest installed PostgreSQL's programs (Debian's layout)."""
    found = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return found[-1].parent if found else None


class PostgresServer:
    """One server: `start`, `crash`, `start` again, `url(db)`, `stop`."""

    def __init__(self, bin_dir: Path, root: Path) -> None:
        self._bin = bin_dir
        self.root = root
        self.data = root / "data"
        self.log = root / "server.log"
        self.port = free_port()

    def _run(self, *argv: str, timeout: float = 60) -> None:
        command = [str(self._bin / argv[0]), *argv[1:]]
        if os.geteuid() == 0:
            command = ["runuser", "-u", OS_USER, "--", *command]
        subprocess.run(command, check=True, capture_output=True, timeout=timeout)

    def _log_tail(self) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-15:])
        except OSError:
            return "(no server log)"

    def init(self) -> None:
        self._run("initdb", "-D", str(self.data), "-U", OS_USER, "--auth=trust", "--no-sync")

    def start(self) -> None:
        """Start the server, again after a crash. Once in a full suite a start right after a
        crash failed at once (exit 1, the log gone with the folder): it is tried again a few
        times, and the last failure says what the server logged."""
        options = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root}"
            " -c fsync=off -c full_page_writes=off -c max_connections=200"
        )
        start = ("pg_ctl", "-D", str(self.data), "-l", str(self.log), "-w", "-o", options, "start")
        for attempt in range(START_ATTEMPTS):
            try:
                self._run(*start)
                return
            except subprocess.CalledProcessError as failed:
                if attempt == START_ATTEMPTS - 1:
                    raise RuntimeError(
                        f"PostgreSQL did not start: {failed.stderr!r}; its log ends:\n"
                        + self._log_tail()
                    ) from failed
                time.sleep(1.0)

    def crash(self) -> None:
        """Stop at once, as a crash: clients see their connections drop."""
        self._run("pg_ctl", "-D", str(self.data), "-m", "immediate", "stop")

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", "fast", "stop")

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{OS_USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE DATABASE {name}")
        return self.url(name)


@contextmanager
def own_postgres_server() -> Iterator[PostgresServer]:
    """A started server of the test's own, removed afterwards; skips (saying why) where
    PostgreSQL is not installed or cannot be run as its user."""
    bin_dir = _bin_dir()
    if bin_dir is None:
        pytest.skip("PostgreSQL is not installed (no /usr/lib/postgresql/*/bin/pg_ctl)")
    try:
        owner = pwd.getpwnam(OS_USER)
    except KeyError:
        pytest.skip(f"no {OS_USER!r} OS user to run a PostgreSQL server as")
    if os.geteuid() not in (0, owner.pw_uid):
        pytest.skip(f"a PostgreSQL server of the test's own needs root or the {OS_USER!r} user")
    root = Path(tempfile.mkdtemp(prefix="postroom-pg-"))
    os.chown(root, owner.pw_uid, owner.pw_gid)
    server = PostgresServer(bin_dir, root)
    try:
        server.init()
        server.start()
        yield server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):  # a test stopped it last
            server.stop()
        shutil.rmtree(root, ignore_errors=True)
