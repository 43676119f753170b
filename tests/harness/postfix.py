"""A private, stock Debian Postfix as a real smarthost client of the relay under test.

Each instance has its own configuration, queue and data folders in a temporary directory
(never /etc/postfix or the system queue), listens on no port at all (its master.cf runs no
smtpd: mail comes in only through `sendmail -C`), and relays everything to
``[127.0.0.1]:<relay port>`` with STARTTLS and SASL, as an operator's Postfix would use
Postroom. Several can run at once (pytest-xdist workers): nothing is shared but the binaries.
`running` stops the instance and removes its folders however the test ends.

Postfix runs its services as the ``postfix`` user, so the temporary directory is made
world-traversable and the queue is created by ``postfix set-permissions``.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import trio

POSTFIX = Path("/usr/sbin/postfix")
SENDMAIL = Path("/usr/sbin/sendmail")
MISSING = "Debian's postfix is not installed (apt-get install postfix libsasl2-modules)"

# Only what a relaying client needs: no smtpd (no listening port), no local delivery, and
# nothing chrooted (the folders are ours, not /var/spool/postfix).
_MASTER_CF = """\
pickup    unix  n       -       n       60      1       pickup
cleanup   unix  n       -       n       -       0       cleanup
qmgr      unix  n       -       n       300     1       qmgr
tlsmgr    unix  -       -       n       1000?   1       tlsmgr
rewrite   unix  -       -       n       -       -       trivial-rewrite
bounce    unix  -       -       n       -       0       bounce
defer     unix  -       -       n       -       0       bounce
trace     unix  -       -       n       -       0       bounce
verify    unix  -       -       n       -       1       verify
flush     unix  n       -       n       1000?   0       flush
proxymap  unix  -       -       n       -       -       proxymap
smtp      unix  -       -       n       -       -       smtp
relay     unix  -       -       n       -       -       smtp
showq     unix  n       -       n       -       -       showq
error     unix  -       -       n       -       -       error
retry     unix  -       -       n       -       -       error
discard   unix  -       -       n       -       -       discard
anvil     unix  -       -       n       -       1       anvil
scache    unix  -       -       n       -       1       scache
postlog   unix-dgram n  -       n       -       1       postlogd
"""


@dataclass(frozen=True)
class PostfixInstance:
    """A started instance: `config` is its configuration folder (sendmail -C), `log` its
    mail log."""

    root: Path
    relay: tuple[str, int]

    @property
    def config(self) -> Path:
        return self.root / "etc"

    @property
    def log(self) -> Path:
        return self.root / "maillog"

    async def sendmail(self, sender: str, recipients: list[str], message: bytes) -> None:
        """Inject `message` as a local program does: `sendmail -C <config> -f sender -- to`."""
        command = [str(SENDMAIL), "-C", str(self.config), "-f", sender, "--", *recipients]
        await trio.run_process(command, stdin=message, capture_stdout=True, capture_stderr=True)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _main_cf(root: Path, relay: tuple[str, int], login: tuple[str, str], ca_file: Path) -> str:
    host, port = relay
    username, password = login
    return f"""\
compatibility_level = 3.6
config_directory = {root / "etc"}
queue_directory = {root / "queue"}
data_directory = {root / "data"}
mail_owner = postfix
setgid_group = postdrop
maillog_file_prefixes = {root}
maillog_file = {root / "maillog"}
myhostname = postfix.client.test
mydomain = client.test
myorigin = $myhostname
mydestination =
inet_interfaces = loopback-only
inet_protocols = ipv4
local_transport = error:local delivery is disabled
alias_maps =
alias_database =
biff = no
relayhost = [{host}]:{port}
smtputf8_enable = yes
smtp_tls_security_level = encrypt
smtp_tls_CAfile = {ca_file}
smtp_sasl_auth_enable = yes
smtp_sasl_password_maps = inline:{{ [{host}]:{port}={username}:{password} }}
smtp_sasl_security_options = noanonymous
in_flow_delay = 0
queue_run_delay = 1s
minimal_backoff_time = 1s
maximal_backoff_time = 2s
"""


def _postfix(root: Path, *command: str) -> None:
    done = subprocess.run(
        [str(POSTFIX), "-c", str(root / "etc"), *command], capture_output=True, timeout=60
    )
    if done.returncode:  # Postfix says why in its log (on stderr only to a terminal)
        log = root / "maillog"
        said = log.read_text(errors="replace") if log.exists() else done.stderr.decode()
        raise RuntimeError(f"postfix {' '.join(command)} failed: {said[-2000:]}")


def _start(relay: tuple[str, int], login: tuple[str, str], ca_file: Path) -> Path:
    root = Path(tempfile.mkdtemp(prefix="postroom-postfix-"))
    root.chmod(0o755)  # the postfix user reaches its queue through it
    try:
        for folder in ("etc", "data", "queue"):
            (root / folder).mkdir()
        shutil.chown(root / "data", "postfix")
        (root / "etc" / "main.cf").write_text(_main_cf(root, relay, login, ca_file))
        (root / "etc" / "master.cf").write_text(_MASTER_CF)
        _postfix(root, "set-permissions")  # creates the queue, owned as Postfix wants it
        _postfix(root, "start")
    except BaseException:
        _stop(root)
        raise
    return root


def _stop(root: Path) -> None:
    with contextlib.suppress(subprocess.SubprocessError, OSError, RuntimeError):
        _postfix(root, "stop")
    shutil.rmtree(root, ignore_errors=True)


@contextlib.asynccontextmanager
async def running(
    relay: tuple[str, int], login: tuple[str, str], ca_file: Path
) -> AsyncIterator[PostfixInstance]:
    """A Postfix relaying to `relay` with SMTP credential `login`, trusting `ca_file`;
    stopped and removed on the way out, whatever happens."""
    root = await trio.to_thread.run_sync(_start, relay, login, ca_file)
    try:
        yield PostfixInstance(root, relay)
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_stop, root)
