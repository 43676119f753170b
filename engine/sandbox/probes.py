"""Address verification (`/v1/verify`, the MCP door's verify tool) for any workspace: in a
sandboxed one the sandbox answers the probe from the address's script
(engine/sandbox/scripts.py: `bounce` is refused, a deferring script defers, any other address
is accepted), with no DNS lookup and no connection, since nothing a sandboxed workspace does
leaves the machine; other workspaces get the real probe (engine/delivery/verification.py).
Both count against the same limit and read the answer the same way."""

from __future__ import annotations

from engine.delivery import verification
from engine.delivery.verification import Verification
from engine.platform.runtime import Principal, Runtime
from engine.sandbox.scripts import answer, script_for
from storage import sandbox

# The mail host a sandboxed verification names: a reserved name (RFC 2606) no real server has.
SANDBOX_HOST = "sandbox.invalid"


async def verify(rt: Runtime, who: Principal, email: str) -> Verification:
    """Check one address for `who`'s workspace (RateLimited once its limit is reached)."""
    if not await rt.db.read(sandbox.is_sandboxed, who.workspace_id):
        return await verification.verify(rt, who, email, rt.system_from)
    address = await verification.counted(rt, who, email)
    if isinstance(address, Verification):
        return address
    reply = answer(script_for(address), address, attempts=0)
    return verification.judged(address, reply, True, SANDBOX_HOST)
