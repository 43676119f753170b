"""Pytest plugin exposing the test peers as fixtures.

Enable with ``pytest_plugins = ["tests.harness.fixtures"]`` in ``tests/conftest.py``.
The servers run in pytest-trio's ``nursery`` fixture, so they stop when the test ends.
"""

from __future__ import annotations

import pytest
import trio

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
