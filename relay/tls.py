"""The certificate the relay and the inbound MX present for STARTTLS.

POSTROOM_TLS_CERT / POSTROOM_TLS_KEY when they are set; otherwise a self-signed one for
POSTROOM_SMTP_HOST, generated on first start and stored with the data (the database's
service secrets, sealed under the master key), so every node of a PostgreSQL deployment and
every restart presents the same certificate. Clients of a self-signed relay must pin it or skip verification; an
operator who wants verified TLS sets the two variables.
"""

from __future__ import annotations

import ssl
import tempfile
from datetime import datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from storage import accounts
from storage.database import Database
from storage.tx import Tx

_VALIDITY = timedelta(days=3650)
_SECRET_NAME = "relay_tls_self_signed"  # certificate PEM then key PEM, in one value


def self_signed(hostname: str, now: datetime) -> str:
    """A new self-signed certificate and key for `hostname`, as PEM text (cert first)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hostname)])
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + _VALIDITY)
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(hostname)]), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return (cert.public_bytes(serialization.Encoding.PEM) + key_pem).decode()


def _stored(tx: Tx, generated: str) -> str:
    return accounts.secret(tx, _SECRET_NAME, generated)


def context_from_pem(pem: str) -> ssl.SSLContext:
    """A server context from PEM text holding the certificate (chain) and its key."""
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    # The ssl module loads certificates from files only; the file lives for this call.
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "relay.pem"
        path.write_text(pem)
        path.chmod(0o600)
        context.load_cert_chain(path)
    return context


async def server_context(
    db: Database, cert: Path | None, key: Path | None, hostname: str, now: datetime
) -> ssl.SSLContext:
    """The STARTTLS context: the configured certificate (its key in `key`, or in the same
    file), else the stored self-signed one."""
    if cert is not None:
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(cert, key)
        return context
    pem: str = await db.write(_stored, self_signed(hostname, now))
    return context_from_pem(pem)
