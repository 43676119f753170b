"""Credentials: random tokens, their hashes, and password hashing.

API keys are 256-bit random tokens, so a single SHA-256 is enough to store them safely and
lets a request be authenticated with one indexed lookup. Passwords are low-entropy and are
hashed with argon2id instead. Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

import trio
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

API_KEY_PREFIX = "svc_k_"

_hasher = PasswordHasher()
# Verified against when the user does not exist, so both paths cost the same time.
_DUMMY_HASH = _hasher.hash(secrets.token_urlsafe(16))


def new_api_key() -> tuple[str, str, str]:
    """A new key: (raw key, its 8-character prefix, its hash)."""
    token = secrets.token_urlsafe(32)
    raw = API_KEY_PREFIX + token
    return raw, token[:8], token_hash(raw)


def token_hash(raw: str) -> str:
    """The stored form of a high-entropy token."""
    return hashlib.sha256(raw.encode()).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time string equality."""
    return hmac.compare_digest(a.encode(), b.encode())


async def hash_password(password: str) -> str:
    """The argon2id hash of a password, computed off the event loop."""
    return await trio.to_thread.run_sync(_hasher.hash, password)


def _verify(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


async def verify_password(password_hash: str | None, password: str) -> bool:
    """Whether `password` matches; a None hash (unknown user) costs the same and fails."""
    return await trio.to_thread.run_sync(_verify, password_hash, password)
