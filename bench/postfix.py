"""Postfix as the yardstick: a private instance on loopback and Postfix's own SMTP load client.

`postfix_instance(sink_port, tuned, connections)` writes a config directory of its own
(main.cf and master.cf in a temporary folder, its own queue and data directories), starts it
with `postfix -c DIR`, and yields it (its smtpd's loopback port, the CPU its processes spent);
`private_postfix(sink_port)` yields the port of a stock one. It relays every message to the
sink at `127.0.0.1:sink_port` (relayhost) and delivers nothing locally. Stock is Postfix's
defaults; tuned is a relay set for throughput (TUNED: no inflow delay, the delivery
concurrency matched to Postroom's connections, see `_tuned`). The system's own Postfix, if
any, is not touched. Postfix runs its daemons as root then drops to the `postfix` user, so
this needs root, as installing Postfix did.

`CSink` is Postfix's `smtp-sink`, a C SMTP server that accepts and discards every message
and counts them: the receiving MX that costs next to nothing, where the project's Python
test sink takes a share of this machine's cores.

`smtp_source(port, count, sessions)` drives an SMTP server with `smtp-source`, the C load
client shipped with Postfix (no AUTH, so Postfix only). `relay_client(port, ...)` drives it
with bench/relay.py's smtplib client (`--no-auth`), the client that measures our relay, so
the two relays are compared with the same client.
Everything is skipped with a message when Postfix is not installed (`apt-get install postfix`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import trio

POSTFIX = "/usr/sbin/postfix"
SMTP_SOURCE = "/usr/sbin/smtp-source"
SMTP_SINK = "/usr/sbin/smtp-sink"
DAEMONS = "/usr/lib/postfix/sbin"
MESSAGE_BYTES = 1500  # about the size of a Postroom test email with its DKIM signature


def missing() -> str | None:
    """Why Postfix cannot be the yardstick here, or None when it can."""
    for tool in (POSTFIX, SMTP_SOURCE, SMTP_SINK):
        if not Path(tool).exists():
            return f"{tool} is not installed (apt-get install postfix): Postfix figures skipped"
    if os.geteuid() != 0:
        return "a private Postfix instance needs root: Postfix figures skipped"
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _main_cf(folder: Path, sink_port: int) -> str:
    return f"""
compatibility_level = 3.6
queue_directory = {folder}/queue
data_directory = {folder}/data
command_directory = /usr/sbin
daemon_directory = {DAEMONS}
mail_owner = postfix
setgid_group = postdrop
myhostname = postfix.bench.test
mydomain = bench.test
myorigin = $myhostname
mydestination =
local_recipient_maps =
local_transport = error:no local delivery
alias_maps =
alias_database =
inet_interfaces = 127.0.0.1
inet_protocols = ipv4
mynetworks = 127.0.0.0/8
smtpd_relay_restrictions = permit_mynetworks, reject
relayhost = [127.0.0.1]:{sink_port}
smtp_tls_security_level = none
smtpd_tls_security_level = none
maillog_file_prefixes = {folder}
maillog_file = {folder}/maillog
message_size_limit = 52428800
"""


def _tuned(connections: int, sink_port: int) -> str:
    """main.cf lines of a relay tuned for throughput, each with why."""
    settings = {
        # Stock smtpd sleeps up to 1 s per message while the queue manager is behind: a
        # brake on inflow that flatters a ratio against it.
        "in_flow_delay": "0",
        # Headroom for 50 injecting sessions plus the delivery agents (stock 100).
        "default_process_limit": "200",
        # As many connections to the MX as Postroom opens to one destination, from the
        # first message (stock starts at 5 and may grow to 20).
        "smtp_destination_concurrency_limit": str(connections),
        "initial_destination_concurrency": str(connections),
        # One recipient per message here; no per-destination pacing.
        "smtp_destination_rate_delay": "0s",
        # Reuse each connection for the next message, as Postroom does, not only when a
        # backlog happens to build up (on demand).
        # (the next hop as relayhost names it, port included)
        "smtp_connection_cache_destinations": f"[127.0.0.1]:{sink_port}",
        # The queue manager takes in as many messages as a run holds at once.
        "qmgr_message_active_limit": "50000",
        "qmgr_message_recipient_limit": "50000",
        # No reverse lookup of 127.0.0.1 for every injecting connection.
        "smtpd_peername_lookup": "no",
    }
    return "".join(f"{name} = {value}\n" for name, value in settings.items())


def _master_cf(smtpd_port: int) -> str:
    # The stock services, with smtpd moved to a loopback port of our own; postlog writes the log.
    services = [
        f"127.0.0.1:{smtpd_port} inet n - n - - smtpd",
        "pickup unix n - n 60 1 pickup",
        "cleanup unix n - n - 0 cleanup",
        "qmgr unix n - n 300 1 qmgr",
        "tlsmgr unix - - n 1000? 1 tlsmgr",
        "rewrite unix - - n - - trivial-rewrite",
        "bounce unix - - n - 0 bounce",
        "defer unix - - n - 0 bounce",
        "trace unix - - n - 0 bounce",
        "verify unix - - n - 1 verify",
        "flush unix n - n 1000? 0 flush",
        "proxymap unix - - n - - proxymap",
        "smtp unix - - n - - smtp",
        "relay unix - - n - - smtp",
        "showq unix n - n - - showq",
        "error unix - - n - - error",
        "retry unix - - n - - error",
        "discard unix - - n - - discard",
        "anvil unix - - n - 1 anvil",
        "scache unix - - n - 1 scache",
        "postlog unix-dgram n - n - 1 postlogd",
    ]
    return "\n".join(services) + "\n"


@dataclass(frozen=True, slots=True)
class Instance:
    port: int  # its smtpd, on 127.0.0.1
    folder: Path  # main.cf, master.cf, the queue

    def main_cf(self) -> str:
        return (self.folder / "main.cf").read_text()

    def cpu_seconds(self) -> float:
        """User and system CPU of master and every daemon, those that ended and were reaped
        included (smtpd ends after 100 sessions: its CPU then counts in master's)."""
        master = int((self.folder / "queue" / "pid" / "master.pid").read_text().split()[0])
        return tree_cpu_seconds(master, reaped=True)


def tree_cpu_seconds(pid: int, reaped: bool = False) -> float:
    """User and system CPU seconds of a process and every descendant; with `reaped`, also
    the CPU of the children they waited for (cutime and cstime)."""
    ticks = 0
    pending = [pid]
    while pending:
        process = pending.pop()
        try:
            # The fields after the command name's ")": utime, stime, cutime, cstime are the
            # 12th to the 15th.
            fields = Path(f"/proc/{process}/stat").read_text().rsplit(")", 1)[1].split()
            ticks += sum(int(field) for field in fields[11 : 15 if reaped else 13])
            for task in Path(f"/proc/{process}/task").iterdir():
                pending += [int(child) for child in (task / "children").read_text().split()]
        except FileNotFoundError:  # it ended meanwhile
            continue
    return ticks / os.sysconf("SC_CLK_TCK")


@contextmanager
def postfix_instance(
    sink_port: int, tuned: bool = False, connections: int = 4
) -> Iterator[Instance]:
    """A Postfix of our own relaying to the sink, stock or tuned (with `connections` to it)."""
    folder = Path(tempfile.mkdtemp(prefix="postroom-postfix-"))
    folder.chmod(0o755)  # the postfix user reaches its queue through it
    port = _free_port()
    main_cf = _main_cf(folder, sink_port) + (_tuned(connections, sink_port) if tuned else "")
    (folder / "main.cf").write_text(main_cf)
    (folder / "master.cf").write_text(_master_cf(port))
    config = ["-c", str(folder)]
    (folder / "queue").mkdir(mode=0o755)  # postfix makes its subfolders and data/ itself
    try:
        subprocess.run([POSTFIX, *config, "set-permissions"], check=True, capture_output=True)
        subprocess.run([POSTFIX, *config, "start"], check=True, capture_output=True)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        yield Instance(port, folder)
    finally:
        subprocess.run([POSTFIX, *config, "stop"], capture_output=True)
        time.sleep(0.5)  # master takes its children down
        shutil.rmtree(folder, ignore_errors=True)


@contextmanager
def private_postfix(sink_port: int) -> Iterator[int]:
    """A stock Postfix of our own relaying to the sink; yields its smtpd port."""
    with postfix_instance(sink_port) as instance:
        yield instance.port


class CSink:
    """Postfix's smtp-sink on a loopback port: accepts every message, keeps none, counts.
    `host` and `port` place it (a second MX site on 127.0.0.2 shares the first one's port,
    as the service connects to every MX on one port); a free port on 127.0.0.1 by default."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        self.host = host
        self.port = port or _free_port()
        self.received = 0
        self._arrived = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        # -c: counters on stdout, "sess=N quit=N mesg=N" ending in \r, at each "." received.
        command = [SMTP_SINK, "-c", f"{self.host}:{self.port}", "1024"]
        if os.geteuid() == 0:
            command[1:1] = ["-u", "nobody"]  # it refuses to keep root
        process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
        assert process.stdout is not None
        try:
            while True:
                try:
                    with socket.create_connection((self.host, self.port), timeout=1):
                        break
                except OSError:
                    await trio.sleep(0.05)
            task_status.started(self.port)
            tail = b""
            while chunk := await process.stdout.receive_some(65536):
                tail = (tail + chunk)[-256:]
                counts = re.findall(rb"mesg=(\d+)\r", tail)  # whole records only
                if counts and int(counts[-1]) != self.received:
                    self.received = int(counts[-1])
                    self._arrived.set()
                    self._arrived = trio.Event()
        finally:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()

    async def wait_for_messages(
        self,
        n: int,
        timeout: float = 10,  # noqa: ASYNC109 - as the Python sink's
    ) -> None:
        """Wait until at least `n` messages were received in all."""
        with trio.fail_after(timeout):
            while self.received < n:
                await self._arrived.wait()


def smtp_source(
    port: int, count: int, sessions: int = 50, recipient: str = "reader@dest.example"
) -> float:
    """Send `count` messages over `sessions` parallel connections; messages/s accepted."""
    started = time.perf_counter()
    subprocess.run(
        [
            SMTP_SOURCE,
            "-s",
            str(sessions),
            "-m",
            str(count),
            "-l",
            str(MESSAGE_BYTES),
            "-f",
            "news@bench.example.org",
            "-t",
            recipient,
            "-S",
            "Benchmark",
            f"127.0.0.1:{port}",
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )
    return count / (time.perf_counter() - started)


async def relay_client(
    port: int, seconds: float = 5.0, clients: int = 4, threads: int = 8
) -> float:
    """bench/relay.py's client (as it runs against our relay, without AUTH) for `seconds`
    from `clients` processes of `threads` connections each; accepted messages/s."""
    command = [
        sys.executable,
        str(Path(__file__).with_name("relay.py")),
        "--client",
        "--no-auth",
        "--port",
        str(port),
        "--seconds",
        str(seconds),
        "--threads",
        str(threads),
    ]
    rates: list[float] = []

    async def one() -> None:
        done = await trio.run_process(command, capture_stdout=True)
        result = json.loads(done.stdout)
        rates.append(result["sent"] / result["seconds"])

    async with trio.open_nursery() as nursery:
        for _ in range(clients):
            nursery.start_soon(one)
    return sum(rates)
