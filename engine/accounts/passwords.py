"""Credentials: random tokens and their hashes.

API keys are 256-bit random tokens, so a single SHA-256 is enough to store them safely and
lets a request be authenticated with one indexed lookup. Passwords are low-entropy and are
hashed with argon2id instead (engine/platform/password_hashing.py, on threads of its own).
Every comparison is constant-time.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

API_KEY_PREFIX = "svc_k_"
# Test keys act only in sandbox mode (engine/sandbox/keys.py); their shown prefix starts so too.
TEST_KEY_MARK = "test_"
TEST_KEY_PREFIX = API_KEY_PREFIX + TEST_KEY_MARK


def new_api_key(test: bool = False) -> tuple[str, str, str]:
    """A new key: (raw key, its 8-character prefix, its hash); `test`: a test key."""
    token = secrets.token_urlsafe(32)
    raw = (TEST_KEY_PREFIX if test else API_KEY_PREFIX) + token
    return raw, (TEST_KEY_MARK if test else "") + token[:8], token_hash(raw)


def token_hash(raw: str) -> str:
    """The stored form of a high-entropy token."""
    return hashlib.sha256(raw.encode()).hexdigest()


def same(a: str, b: str) -> bool:
    """Constant-time string equality."""
    return hmac.compare_digest(a.encode(), b.encode())
