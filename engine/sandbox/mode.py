"""Sandbox mode of a workspace: switching it, and domains verified without DNS.

In sandbox mode nothing a workspace sends leaves the machine (engine/sandbox/capture.py),
so a domain may be marked verified without publishing anything (engine/domains/registry.py
`mark`: valid only inside this workspace while it is sandboxed; a DNS proof elsewhere wins).
Because a marked name keeps other sandboxed workspaces from marking it, only a platform
administrator puts a workspace in the sandbox (or the install does, for new workspaces, with
POSTROOM_SANDBOX=on). Leaving it is refused while mail that would then go out for real still
waits, and sets the domains the sandbox verified back to pending: from then on only DNS
verifies them. What a test key may do is decided at the API's door (api/test_keys.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine.accounts import users
from engine.activity import Change, record
from engine.domains import registry
from engine.platform.errors import Conflict, Forbidden
from engine.platform.runtime import Principal, Runtime
from storage import domains, sandbox
from storage.domains import Domain
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class SandboxState:
    enabled: bool
    sandbox_verified_domains: list[str]  # names


def require_sandbox(tx: Tx, workspace_id: str) -> None:
    """Forbidden (`sandbox_only`) unless the workspace is in sandbox mode."""
    if not sandbox.is_sandboxed(tx, workspace_id):
        raise Forbidden("this workspace is not in sandbox mode", code="sandbox_only")


def _state(tx: Tx, workspace_id: str) -> SandboxState:
    names = [name for _, name in sandbox.sandbox_verified_domains(tx, workspace_id)]
    return SandboxState(sandbox.is_sandboxed(tx, workspace_id), names)


async def state(rt: Runtime, who: Principal) -> SandboxState:
    return await rt.db.read(_state, who.workspace_id)


def _enable(tx: Tx, who: Principal, now: datetime) -> None:
    if sandbox.set_sandboxed(tx, who.workspace_id, True):
        change = Change("sandbox.enabled", who.workspace_id, who.workspace_id)
        record(tx, who.workspace_id, who.user_email, change, now)


def _disable(tx: Tx, who: Principal, now: datetime) -> None:
    if not sandbox.is_sandboxed(tx, who.workspace_id, lock=True):
        return
    waiting = sandbox.mail_waiting(tx, who.workspace_id)
    if waiting:
        raise Conflict(
            f"{waiting} emails are still waiting to be sent; leaving the sandbox would send"
            " them for real: cancel them or let them finish first",
            code="sandbox_mail_waiting",
            waiting=waiting,
        )
    names = []
    for domain_id, name in sandbox.sandbox_verified_domains(tx, who.workspace_id):
        domain = domains.get(tx, who.workspace_id, domain_id)
        assert domain is not None
        registry.drop_mark(tx, domain, "left the sandbox: verify it in DNS", who.user_email, now)
        names.append(name)
    sandbox.set_sandboxed(tx, who.workspace_id, False)
    meta_off = {"domains_pending": names}
    change = Change("sandbox.disabled", who.workspace_id, who.workspace_id, meta_off)
    record(tx, who.workspace_id, who.user_email, change, now)


async def switch(rt: Runtime, who: Principal, on: bool) -> SandboxState:
    """Put the workspace in the sandbox (platform administrators only) or take it out."""
    if on:
        await users.require_admin(rt, who)
        await rt.db.write(_enable, who, rt.clock.now())
    else:
        await rt.db.write(_disable, who, rt.clock.now())
    return await state(rt, who)


async def mark_verified(rt: Runtime, who: Principal, domain_id: str) -> Domain:
    """Mark a domain of a sandboxed workspace verified without DNS (Conflict `domain_taken`
    when another workspace holds the name verified)."""
    return await rt.db.write(
        registry.mark, who.user_email, who.workspace_id, domain_id, rt.clock.now()
    )
