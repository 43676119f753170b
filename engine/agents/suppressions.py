"""What an agent may do to the suppression list: add and lift manual entries only.

A bounce, a complaint or an unsubscribe is the recipient's own word (lifting one can break
the law on unsolicited mail); only a person decides to write to that address again, through
the API or the console. An entry someone added by hand (`manual`) an agent may lift.
"""

from __future__ import annotations

from engine.addresses import normalize_email
from engine.platform.errors import Forbidden, NotFound, Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.suppressions import entries
from storage import suppressions

# The reason of every entry an agent adds: one it may lift again. A bounce, a complaint or
# an unsubscribe is what a recipient did, which an agent can only claim, never know.
REASON = "manual"
LIFTABLE = (REASON,)


async def lift(rt: Runtime, who: Principal, email: str) -> None:
    """Lift a manual suppression (engine/suppressions/entries.py); Forbidden for the others."""
    try:
        address = normalize_email(email)
    except Unprocessable:
        raise NotFound(f"{email!r} is not suppressed") from None
    found = await rt.db.read(suppressions.get, who.workspace_id, address)
    if found is not None and found.reason not in LIFTABLE:
        raise Forbidden(
            f"{address} is suppressed for {found.reason}: agents lift only manual entries;"
            " a person can lift it through the API or the console",
            code="agent_forbidden",
        )
    await entries.remove(rt, who, address)
