"""The master key that seals secrets at rest, and the start-up step that puts it to use.

The key is POSTROOM_SECRET_KEY when that is set, else the text of POSTROOM_SECRET_KEY_FILE,
created (mode 0600) on a database's first start. Every node on one database must hold the
same key. A key that does not open what the database has sealed stops start-up with one line
saying what to do, and a new key is never made while sealed secrets exist: it could not open
them.
"""

from __future__ import annotations

import logging
import os
import secrets
from pathlib import Path

from engine.platform.errors import EngineError
from postroom.config import Settings
from storage import accounts, sealed_columns
from storage.database import Database
from storage.sealing import Sealer, SealingError

log = logging.getLogger("postroom")

# A service secret sealed on first start: it opens only with the master key of that start.
_CHECK_NAME = "master_key_check"
_CHECK_VALUE = "sealed with this database's master key"


class MasterKeyError(EngineError):
    """Raised at start-up when the master key is missing, unreadable or not the one this
    database's secrets were sealed with."""

    code = "master_key"


async def install(db: Database, settings: Settings) -> None:
    """Give storage the master key, check it against the database, then seal in one
    transaction every secret still stored in clear (a database written before sealing)."""
    db.use_master_key(Sealer(await _master_key(db, settings)))
    try:
        await db.write(accounts.secret, _CHECK_NAME, _CHECK_VALUE)
    except SealingError:
        raise MasterKeyError(_mismatch(settings)) from None
    if sealed := await db.transaction(sealed_columns.seal_clear_values):
        log.info("sealed %d secrets that were stored in clear", sealed)


def _mismatch(settings: Settings) -> str:
    if settings.secret_key is not None:
        return (
            "POSTROOM_SECRET_KEY does not open the secrets sealed in this database: set it to"
            " the value the database was sealed with (every node must use the same one), or"
            " unset it if the database was sealed with a key file"
        )
    path = settings.secret_key_file.absolute()
    return (
        f"the key file {path} does not open the secrets sealed in this database: restore the"
        f" key file it was sealed with (from a backup or another node: every node must use the"
        f" same one) to {path}, or point POSTROOM_SECRET_KEY_FILE at it"
    )


async def _master_key(db: Database, settings: Settings) -> bytes:
    if settings.secret_key is not None:
        return settings.secret_key.encode()
    path = settings.secret_key_file.absolute()
    try:
        return _read(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise MasterKeyError(
            f"cannot read the key file {path}: {exc.strerror}; check POSTROOM_SECRET_KEY_FILE"
        ) from None
    if await db.read(sealed_columns.anything_sealed):
        raise MasterKeyError(
            f"no key file at {path}, but this database holds secrets sealed with a master key:"
            f" restore the key file they were sealed with (from a backup or another node) to"
            f" {path}, or point POSTROOM_SECRET_KEY_FILE at it; a new key could not open them"
        )
    try:
        return _create(path)
    except OSError as exc:
        raise MasterKeyError(
            f"cannot create the key file {path}: {exc.strerror}; check POSTROOM_SECRET_KEY_FILE"
        ) from None


def _read(path: Path) -> bytes:
    key = path.read_text(encoding="utf-8").strip()
    if not key:
        raise MasterKeyError(
            f"the key file {path} is empty: restore it from a node already using this database"
            f" (or delete it on a new installation)"
        )
    return key.encode()


def _create(path: Path) -> bytes:
    """A new random key written to `path` (mode 0600); the existing key if another process
    (a worker, a node on this host) created it first."""
    path.parent.mkdir(parents=True, exist_ok=True)
    key = secrets.token_urlsafe(32)
    # Written whole under a temporary name, then linked into place: a concurrent start never
    # reads a half-written key, and a link never replaces a key that exists.
    temporary = path.with_name(f".{path.name}.{secrets.token_hex(4)}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(descriptor, "w", encoding="utf-8") as file:
            file.write(key + "\n")
            file.flush()
            os.fsync(file.fileno())
        os.link(temporary, path)
    except FileExistsError:
        return _read(path)
    finally:
        temporary.unlink(missing_ok=True)
    # The key must outlive a power cut as surely as the secrets sealed with it.
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
    return key.encode()
