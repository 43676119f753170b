"""Secrets at rest: DKIM private keys, webhook secrets, two-factor secrets and the service's own
secrets are sealed in the database.

A value is sealed with AES-256-GCM under a key derived (HKDF-SHA256) from the master key and
stored as `enc:v1:<base64(nonce | ciphertext)>`. Its table, column and row are bound in as
associated data, so an altered value, or one copied to another row, does not open.
Repositories seal on write and unseal on read with their transaction's `Sealer` (`tx.sealer`):
nothing above storage ever sees a sealed value, nor can storage write a secret in clear.

The same master key keys the fingerprints storage keeps in place of a value it must forget
(`Sealer.fingerprint`: an erased address): HMAC-SHA256 under a key of its own, derived with
its own label, so the fingerprint confirms a guessed value only to someone holding the key.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PREFIX = "enc:v1:"
_NONCE_BYTES = 12
# Names the purpose, so the same master key could never yield this key for anything else.
_HKDF_INFO = b"postroom/secrets-at-rest/v1"
_FINGERPRINT_INFO = b"postroom/fingerprints/v1"


class SealingError(Exception):
    """Raised when a stored secret does not open (the master key is not the one it was sealed
    with, or the value was altered or moved to another row), or when a secret must be sealed
    or opened and storage was given no master key."""


@dataclass(frozen=True, slots=True)
class SealedColumn:
    """A column whose values are sealed, and the column naming each row (bound into them)."""

    table: str
    column: str
    row_key: str


DKIM_PRIVATE_KEY = SealedColumn("domains", "dkim_private_key", "id")
SERVICE_SECRET = SealedColumn("service_secrets", "value", "name")
WEBHOOK_BASIC_AUTH = SealedColumn("webhooks", "basic_auth", "id")  # `user:password`
ED25519_PRIVATE_KEY = SealedColumn("domains", "ed25519_private_key", "id")  # NULL until made
WEBHOOK_SECRET = SealedColumn("webhooks", "secret", "id")  # the `whsec_…` signing key
TOTP_SECRET = SealedColumn("user_totp", "secret", "user_id")  # a user's two-factor secret
SEALED_COLUMNS = (
    DKIM_PRIVATE_KEY,
    SERVICE_SECRET,
    WEBHOOK_BASIC_AUTH,
    ED25519_PRIVATE_KEY,
    WEBHOOK_SECRET,
    TOTP_SECRET,
)


def _bound(column: SealedColumn, row: str) -> bytes:
    return f"{column.table}.{column.column}\0{row}".encode()


class Sealer:
    """Seals and unseals values under one master key."""

    __slots__ = ("_aead", "_fingerprint_key")

    def __init__(self, master_key: bytes | None) -> None:
        """A sealer for `master_key`; with None, one that refuses every value."""
        if master_key is None:
            self._aead = None
            self._fingerprint_key = b""
            return
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_HKDF_INFO)
        self._aead = AESGCM(hkdf.derive(master_key))
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_FINGERPRINT_INFO)
        self._fingerprint_key = hkdf.derive(master_key)

    def fingerprint(self, value: str) -> str:
        """A keyed digest of `value` (hex): equal values give equal fingerprints, and only
        the master key's holder can tell which value one stands for."""
        if self._aead is None:
            raise SealingError("storage was opened without a master key")
        return hmac.new(self._fingerprint_key, value.encode(), hashlib.sha256).hexdigest()

    def _cipher(self) -> AESGCM:
        if self._aead is None:
            raise SealingError("storage was opened without a master key")
        return self._aead

    def seal(self, column: SealedColumn, row: str, value: str) -> str:
        """The stored form of `value`, the secret in `column` of the row named `row`."""
        nonce = os.urandom(_NONCE_BYTES)
        sealed = self._cipher().encrypt(nonce, value.encode(), _bound(column, row))
        return PREFIX + base64.b64encode(nonce + sealed).decode("ascii")

    def unseal(self, column: SealedColumn, row: str, stored: str) -> str:
        """The secret that `stored` seals; SealingError if it does not open here."""
        cipher = self._cipher()
        if not stored.startswith(PREFIX):
            raise SealingError(f"{column.table}.{column.column} of {row} is not sealed")
        try:
            blob = base64.b64decode(stored.removeprefix(PREFIX), validate=True)
            opened = cipher.decrypt(blob[:_NONCE_BYTES], blob[_NONCE_BYTES:], _bound(column, row))
            return opened.decode()
        except (ValueError, InvalidTag):  # bad base64, a short value, a wrong key or row
            raise SealingError(
                f"{column.table}.{column.column} of {row} does not open with this master key"
            ) from None


NO_MASTER_KEY = Sealer(None)
