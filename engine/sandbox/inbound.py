"""Inbound mail in the sandbox: a message handed to the workspace's own forwarding rules as if
the inbound MX server had accepted it, so a forward can be tried without an MX record.

Only a sandboxed workspace may inject, and only to the source address of one of its own
active forwards: the message then takes the real path (engine/forwarding/inbound.py
`receive`: our trace and authentication results, one job per destination, the forwarder),
where a sandboxed workspace's copies are captured, never sent.
"""

from __future__ import annotations

from dataclasses import dataclass
from email.message import EmailMessage
from email.utils import format_datetime, make_msgid

from engine.addresses import normalize_email
from engine.forwarding import inbound
from engine.mail import trace
from engine.platform.errors import Unprocessable
from engine.platform.runtime import Principal, Runtime
from engine.sandbox.mode import require_sandbox
from storage import forwards
from storage.tx import Tx

# How the injected message says it came in: from the machine itself, as the sandbox.
ARRIVAL = trace.Arrival(helo="sandbox", address="127.0.0.1", name=None, protocol="ESMTP")


@dataclass(frozen=True, slots=True)
class Injection:
    """A message to send to one of the workspace's forward source addresses."""

    to: str
    from_: str
    subject: str
    text: str


def _forward_of(tx: Tx, who: Principal, address: str) -> str | None:
    """The id of the workspace's active forward for `address`, in sandbox mode only."""
    require_sandbox(tx, who.workspace_id)
    rules = forwards.active_by_sources(tx, [address])
    return next((r.id for r in rules if r.workspace_id == who.workspace_id), None)


def _message(injection: Injection, domain: str, rt: Runtime) -> bytes:
    message = EmailMessage()
    message["From"] = injection.from_
    message["To"] = injection.to
    message["Subject"] = injection.subject
    message["Date"] = format_datetime(rt.clock.now())
    message["Message-ID"] = make_msgid(domain=domain)
    message.set_content(injection.text)
    return message.as_bytes()


async def inject(rt: Runtime, who: Principal, injection: Injection) -> str:
    """Receive the message for the forward whose source is `injection.to`; the forward's id.
    Forbidden (`sandbox_only`) outside the sandbox, Unprocessable (`not_a_forward`) for an
    address none of the workspace's active forwards has as its source."""
    to = normalize_email(injection.to, "to")
    sender = normalize_email(injection.from_, "from_address")
    # A header field is one line: a line break in the subject would start another.
    subject = " ".join(injection.subject.splitlines())
    forward_id = await rt.db.read(_forward_of, who, to)
    if forward_id is None:
        raise Unprocessable(
            f"{to} is not the source address of an active forward of this workspace",
            code="not_a_forward",
            errors=[{"loc": ["body", "to"], "msg": "not an active forward's source address"}],
        )
    checked = Injection(to, sender, subject, injection.text)
    data = _message(checked, to.rpartition("@")[2], rt)
    await inbound.receive(rt, sender, [to], data, ARRIVAL)
    return forward_id
