"""Throwaway PKI for tests: one trustme CA and a server certificate for the loopback names.

The test servers (SMTP sink, HTTPS receiver) present the server certificate; the service
under test is told to trust the CA through a PEM file (e.g. ``POSTROOM_EXTRA_CA_FILE``).
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path

import trustme

# Every name a test might dial: the certificate must match whichever one the client used.
LOOPBACK_NAMES: tuple[str, ...] = ("127.0.0.1", "localhost", "::1")


@dataclass(frozen=True)
class TlsAuthority:
    """A CA, the loopback server certificate it issued, and the CA PEM on disk."""

    ca: trustme.CA
    server_cert: trustme.LeafCert
    ca_file: Path

    @property
    def ca_pem(self) -> bytes:
        return self.ca.cert_pem.bytes()

    def server_context(self) -> ssl.SSLContext:
        """A fresh server-side context presenting the loopback certificate."""
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.server_cert.configure_cert(context)
        return context

    def client_context(self) -> ssl.SSLContext:
        """A fresh verifying client context that trusts only the test CA."""
        context = ssl.create_default_context()
        self.ca.configure_trust(context)
        return context


def make_authority(directory: Path) -> TlsAuthority:
    """Create a CA and loopback certificate; write the CA PEM to ``directory/test-ca.pem``.

    Key generation costs tens of milliseconds, so tests share one authority per session
    (see the ``tls_ca`` fixture) rather than calling this per test.
    """
    ca = trustme.CA()
    server_cert = ca.issue_cert(*LOOPBACK_NAMES)
    ca_file = directory / "test-ca.pem"
    ca.cert_pem.write_to_path(str(ca_file))
    return TlsAuthority(ca=ca, server_cert=server_cert, ca_file=ca_file)
