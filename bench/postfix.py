"""Postfix as the yardstick: a private instance on loopback and Postfix's own SMTP load client.

`private_postfix(sink_port)` writes a config directory of its own (main.cf and master.cf in a
temporary folder, its own queue and data directories), starts it with `postfix -c DIR`, and
yields the loopback port its smtpd listens on. It relays every message to the sink at
`127.0.0.1:sink_port` (relayhost) and delivers nothing locally. The system's own Postfix, if
any, is not touched. Postfix runs its daemons as root then drops to the `postfix` user, so
this needs root, as installing Postfix did.

`smtp_source(port, count, sessions)` drives an SMTP server with `smtp-source`, the C load
client shipped with Postfix (no AUTH, so Postfix only). `relay_client(port, ...)` drives it
with bench/relay.py's smtplib client (`--no-auth`), the client that measures our relay, so
the two relays are compared with the same client.
Everything is skipped with a message when Postfix is not installed (`apt-get install postfix`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import trio

POSTFIX = "/usr/sbin/postfix"
SMTP_SOURCE = "/usr/sbin/smtp-source"
DAEMONS = "/usr/lib/postfix/sbin"
MESSAGE_BYTES = 1500  # about the size of a Postroom test email with its DKIM signature


def missing() -> str | None:
    """Why Postfix cannot be the yardstick here, or None when it can."""
    for tool in (POSTFIX, SMTP_SOURCE):
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


@contextmanager
def private_postfix(sink_port: int) -> Iterator[int]:
    """A Postfix of our own relaying to the sink; yields its smtpd port."""
    folder = Path(tempfile.mkdtemp(prefix="postroom-postfix-"))
    folder.chmod(0o755)  # the postfix user reaches its queue through it
    port = _free_port()
    (folder / "main.cf").write_text(_main_cf(folder, sink_port))
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
        yield port
    finally:
        subprocess.run([POSTFIX, *config, "stop"], capture_output=True)
        time.sleep(0.5)  # master takes its children down
        shutil.rmtree(folder, ignore_errors=True)


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
