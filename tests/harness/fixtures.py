"""Pytest plugin exposing the test peers as fixtures.

Enable with ``pytest_plugins = ["tests.harness.fixtures"]`` in ``tests/conftest.py``.
The servers run in pytest-trio's ``nursery`` fixture, so they stop when the test ends.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import trio

from engine.platform.password_hashing import PasswordHashing
from tests.harness.dns_server import DnsServer
from tests.harness.https_receiver import HttpsReceiver
from tests.harness.smtp_sink import SmtpSink
from tests.harness.tls import TlsAuthority, make_authority


@pytest.fixture(scope="session")
def tls_ca(tmp_path_factory: pytest.TempPathFactory) -> TlsAuthority:
    """One CA and loopback server certificate for the whole session; ``.ca_file`` is a PEM."""
    return make_authority(tmp_path_factory.mktemp("tls"))


@pytest.fixture
async def dns_server(nursery: trio.Nursery) -> DnsServer:
    """An empty authoritative DNS server; point the service at ``dns_server.nameserver``."""
    server = DnsServer()
    await nursery.start(server.run)
    return server


@pytest.fixture
async def smtp_sink(nursery: trio.Nursery, tls_ca: TlsAuthority) -> SmtpSink:
    """An SMTP peer offering STARTTLS with the ``tls_ca`` loopback certificate."""
    sink = SmtpSink(tls_ca.server_context())
    await nursery.start(sink.run)
    return sink


@pytest.fixture
async def https_receiver(nursery: trio.Nursery, tls_ca: TlsAuthority) -> HttpsReceiver:
    """An HTTPS endpoint with the ``tls_ca`` loopback certificate; see ``.url``."""
    receiver = HttpsReceiver(tls_ca.server_context())
    await nursery.start(receiver.run)
    return receiver


@pytest.fixture(autouse=True, scope="session")
def one_argon2_hash_per_password() -> Iterator[None]:
    """Each test password is hashed with argon2id once per test process and that real hash
    reused: nearly every test creates an account with the same password, and at ~0.3 s of
    CPU a hash they made a third of the suite's time. Verification (logins, reauth) still
    runs argon2 for real on every call."""
    real = PasswordHashing.hash
    hashed: dict[str, str] = {}

    async def hash_once(self: PasswordHashing, password: str) -> str:
        if password not in hashed:
            hashed[password] = await real(self, password)
        return hashed[password]

    PasswordHashing.hash = hash_once  # type: ignore[method-assign]
    yield
    PasswordHashing.hash = real  # type: ignore[method-assign]
