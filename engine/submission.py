"""The rules of SMTP submission: who may send what through the relay, once authenticated.

The same rules as the API, applied at the SMTP step where a client can best be told:
- MAIL FROM must be an active registered sender on the credential's domain, and that
  domain verified; the plan's monthly volume must have room (checked again on commit).
- RCPT TO a suppressed address is refused with the reason and counts as an attempt of the
  one-time override (engine/suppression_override.py, through `sending.attempt_suppressed`):
  the first attempt opens a 24-hour window, one retry within it is accepted (the override
  is used then), later ones are refused.
- The message's From header must name an active sender on the same domain (what DMARC
  and the recipient see must be what the workspace registered), and the message is stored
  through `raw_mail.store_raw` before the relay answers 250.
Each function returns why it refuses (a sentence for the SMTP reply) or None.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from engine import plans
from engine.raw_mail import RawMail, store_raw, summarize, wake
from engine.runtime import Runtime
from engine.sending import attempt_suppressed, suppression_overrides
from storage import domains, emails, suppressions
from storage.smtp_credentials import RelayLogin
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Accepted:
    email_id: str


def _sender_problem(tx: Tx, login: RelayLogin, address: str) -> str | None:
    if address.rpartition("@")[2] != login.domain_name:
        return f"{address or '<>'} is not on {login.domain_name}, the domain of this credential"
    sender = domains.sender_by_email(tx, login.workspace_id, address)
    if sender is None or not sender.is_active or sender.domain_id != login.domain_id:
        return f"{address} is not a registered sender; add it under /v1/senders/ first"
    domain = domains.get(tx, login.workspace_id, login.domain_id)
    if domain is None or domain.status != "verified":
        return f"{login.domain_name} is not verified"
    return None


def _volume_problem(tx: Tx, login: RelayLogin, now: datetime) -> str | None:
    plan = plans.plan(login.plan)
    used = emails.sent_in_month(tx, login.workspace_id, now.strftime("%Y-%m"))
    if plan.emails_per_month != plans.UNLIMITED and used >= plan.emails_per_month:
        return f"the {plan.name} plan allows {plan.emails_per_month} emails a month"
    return None


def _check_sender(tx: Tx, login: RelayLogin, address: str, now: datetime) -> str | None:
    return _sender_problem(tx, login, address) or _volume_problem(tx, login, now)


async def check_sender(rt: Runtime, login: RelayLogin, address: str) -> str | None:
    """Why MAIL FROM `address` is refused for this credential, or None."""
    return await rt.db.read(_check_sender, login, address.lower(), rt.clock.now())


def _attempt(tx: Tx, workspace_id: str, address: str, now: datetime) -> str | None:
    suppressed = suppressions.suppressed_among(tx, workspace_id, [address])
    if not suppressed:
        return None
    overrides = suppression_overrides(tx, workspace_id, suppressed)
    return attempt_suppressed(tx, workspace_id, suppressed, overrides, now)


async def check_recipient(rt: Runtime, login: RelayLogin, address: str) -> str | None:
    """Why RCPT TO `address` is refused (suppressed, no override), or None.

    Counts as an attempt only for a suppressed address: one read for everyone else.
    """
    address = address.lower()
    found = await rt.db.read(suppressions.suppressed_among, login.workspace_id, [address])
    if not found:
        return None
    reason: str | None = await rt.db.write(_attempt, login.workspace_id, address, rt.clock.now())
    return reason


def _store(tx: Tx, login: RelayLogin, mail: RawMail, now: datetime) -> Accepted | str:
    summary = summarize(mail.data)
    if summary.from_address is None:
        return "the message has no From header with an address"
    problem = _sender_problem(tx, login, summary.from_address) or _volume_problem(tx, login, now)
    if problem is not None:
        return problem
    return Accepted(store_raw(tx, mail, now))


async def submit(
    rt: Runtime, login: RelayLogin, mail_from: str, recipients: list[str], data: bytes
) -> Accepted | str:
    """Store a submitted message (committed when this returns) and wake delivery; or why
    it is refused."""
    mail = RawMail(
        workspace_id=login.workspace_id,
        domain_id=login.domain_id,
        from_email=mail_from.lower(),
        recipients=[r.lower() for r in recipients],
        data=data,
        source="smtp",
    )
    outcome: Accepted | str = await rt.db.write(_store, login, mail, rt.clock.now())
    if isinstance(outcome, Accepted):
        wake(rt, [mail])
    return outcome
