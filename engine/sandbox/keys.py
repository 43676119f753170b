"""Test keys (`svc_k_test_…`): API keys that act only while their workspace is in sandbox mode.

An application can keep a test key in its test configuration: whatever it sends is captured,
never delivered. Created in sandbox mode only (by a person or a full key, never by a test
key), listed and deleted with the other keys; a request with one is refused (403
`sandbox_only`) once its workspace is not in the sandbox, and whatever would outlive the
sandbox (keys, credentials, webhooks, retention, erasure, transfers, leaving the sandbox …)
is refused to it (403 `test_key_forbidden`, api/test_keys.py).
"""

from __future__ import annotations

from datetime import datetime

from engine.accounts.api_keys import PERMISSIONS, CreatedKey, insert_key
from engine.accounts.passwords import TEST_KEY_PREFIX
from engine.platform.runtime import Principal, Runtime
from engine.sandbox.mode import require_sandbox
from storage.tx import Tx


def is_test_key(raw: str) -> bool:
    return raw.startswith(TEST_KEY_PREFIX)


def _create(tx: Tx, who: Principal, name: str, now: datetime) -> CreatedKey:
    require_sandbox(tx, who.workspace_id)
    return insert_key(
        tx,
        who.workspace_id,
        who.plan,
        who.user_id,
        who.user_email,
        name,
        PERMISSIONS,
        now,
        test=True,
    )


async def create(rt: Runtime, who: Principal, name: str) -> CreatedKey:
    """A new test key for a sandboxed workspace (Forbidden `sandbox_only` otherwise)."""
    return await rt.db.write(_create, who, name, rt.clock.now())
