"""The service's own mail about domain transfers: the invitation, the stop link, the decline.

System mail goes out from POSTROOM_SYSTEM_FROM through the normal delivery engine. It belongs
to a hidden system workspace (fixed ids, owned by `system@postroom.invalid`, an address no one
can register) whose only domain is the domain of `system_from`, with status `system`: never
checked nor verified, so it blocks no tenant from verifying that name. Its mail is DKIM-signed
with that domain's own key (logged once, so the operator can publish it) and its envelope
sender is the usual per-email bounce address on that domain.

Rule: a mail is stored in the same unit of work as the transfer change it announces (an
outbox), so the change and its notice commit together; the caller wakes delivery afterwards.
When the transferring workspace is in the sandbox, the notice is kept in its sandbox
(`capture`) instead: nothing it does leaves the machine.
Links point at `{public_url}` paths of the API; tokens appear only in these mails.
"""

from __future__ import annotations

import email.policy
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from email.message import EmailMessage
from email.utils import format_datetime, formataddr, make_msgid

from engine.domains import dkim_keys
from engine.platform.runtime import Runtime
from engine.sending import intake
from engine.sending.intake import Mailbox, NewEmail
from storage import sandbox, transfers
from storage.codec import new_id
from storage.sandbox import Captured
from storage.transfers import SystemIdentity, Transfer
from storage.tx import Tx

SYSTEM_USER_EMAIL = "system@postroom.invalid"
SYSTEM_NAME = "Postroom"
_NAMESPACE = uuid.UUID("5b6f1d0e-3c2a-4f43-9a55-2f7c1e0b8d41")
SYSTEM_USER_ID = str(uuid.uuid5(_NAMESPACE, "system-user"))
SYSTEM_WORKSPACE_ID = str(uuid.uuid5(_NAMESPACE, "system-workspace"))

log = logging.getLogger("postroom.transfers")


@dataclass(frozen=True, slots=True)
class SystemSender:
    """Where system mail comes from: the system workspace's domain and address."""

    workspace_id: str
    domain_id: str
    domain_name: str
    from_address: str


@dataclass(frozen=True, slots=True)
class Notice:
    to: str
    subject: str
    text: str


async def system_sender(rt: Runtime) -> SystemSender:
    """The system sender for `rt.system_from`, created (with a DKIM key) on first use.

    Ids are derived from fixed names, so nodes starting at once agree and the first insert wins.
    """
    domain_name = rt.system_from.rsplit("@", 1)[1].lower()
    sender = SystemSender(
        SYSTEM_WORKSPACE_ID,
        str(uuid.uuid5(_NAMESPACE, "system-domain:" + domain_name)),
        domain_name,
        rt.system_from,
    )
    if await rt.db.read(transfers.system_domain_exists, sender.domain_id):
        return sender
    key = await dkim_keys.generate()
    identity = SystemIdentity(
        user_id=SYSTEM_USER_ID,
        user_email=SYSTEM_USER_EMAIL,
        workspace_id=SYSTEM_WORKSPACE_ID,
        workspace_name=SYSTEM_NAME,
        domain_id=sender.domain_id,
        domain_name=domain_name,
        dkim_selector=key.selector,
        dkim_private_key=key.private_pem,
        dkim_public_key=key.public_b64,
    )
    if await rt.db.write(transfers.ensure_system_identity, identity, rt.clock.now()):
        log.info(
            'system mail from %s is DKIM-signed; publish TXT %s._domainkey.%s "%s"',
            rt.system_from,
            key.selector,
            domain_name,
            dkim_keys.txt_value(key.public_b64),
        )
    return sender


def queue(
    tx: Tx,
    sender: SystemSender,
    notice: Notice,
    now: datetime,
    tags: tuple[str, ...] = ("domain-transfer",),
) -> None:
    """Store one system mail, queued for delivery now (not counted in any volume); the team's
    invitations (engine/team.py) go out this way too."""
    intake.store(
        tx,
        [
            NewEmail(
                workspace_id=sender.workspace_id,
                domain_id=sender.domain_id,
                domain_name=sender.domain_name,
                from_email=sender.from_address,
                from_name=SYSTEM_NAME,
                to=(Mailbox(notice.to),),
                subject=notice.subject,
                text=notice.text,
                tags=tags,
                source="system",
            )
        ],
        now,
        volume_shard=None,
    )


# In place of a token that is its recipient's credential, in a captured notice.
WITHHELD = "<withheld by the sandbox: the recipient's credential>"
SANDBOX_DKIM = "none: the service's own mail, captured by the sandbox before signing"


def capture(
    tx: Tx,
    sender: SystemSender,
    notice: Notice,
    workspace_id: str,
    transfer_id: str,
    now: datetime,
    withhold: str | None = None,
) -> None:
    """Keep a notice about a sandboxed workspace's transfer in that workspace's sandbox
    instead of sending it: nothing it does leaves the machine. A token in it that is the
    recipient's credential (`withhold`) is replaced, so the sandbox never shows it."""
    text = notice.text if withhold is None else notice.text.replace(withhold, WITHHELD)
    message = EmailMessage(policy=email.policy.SMTP)
    message["From"] = formataddr((SYSTEM_NAME, sender.from_address))
    message["To"] = notice.to
    message["Subject"] = notice.subject
    message["Date"] = format_datetime(now)
    message["Message-ID"] = make_msgid(domain=sender.domain_name)
    message.set_content(text)
    captured = Captured(
        id=new_id(),
        workspace_id=workspace_id,
        email_id=transfer_id,
        envelope_from=sender.from_address,
        recipients=[notice.to],
        subject=notice.subject,
        dkim=SANDBOX_DKIM,
        created_at=now,
        data=message.as_bytes(),
    )
    sandbox.capture(tx, [captured], [], now)


def _when(value: datetime) -> str:
    return value.strftime("%Y-%m-%d %H:%M UTC")


def invitation(t: Transfer, token: str, public_url: str) -> Notice:
    """To the recipient: the one-shot accept link."""
    accept = f"{public_url}/v1/domain-transfers/{token}/accept"
    note = f"\nTheir note:\n\n    {t.note}\n" if t.note else ""
    text = (
        f"{t.source_label} wants to transfer the sending domain {t.domain_name} to your"
        f" Postroom account.\n{note}\n"
        f"To accept, POST to this link (it works once; it is your credential, keep it private):\n\n"
        f"    {accept}\n\n"
        f"    curl -X POST {accept}\n\n"
        "Accepting starts a 24-hour safety window during which the sender can still stop the"
        " transfer; after it the domain, its senders and settings move to your workspace.\n\n"
        f"To decline, POST {public_url}/v1/domain-transfers/{t.id}/decline while logged in.\n"
        f"The offer expires on {_when(t.expires_at)}.\n"
    )
    return Notice(t.target_email, f"Transfer of {t.domain_name} to you: please accept", text)


def accepted_notice(t: Transfer, source_email: str, stop_token: str, public_url: str) -> Notice:
    """To the sender: the transfer was accepted, and the one-shot link that stops it."""
    stop = f"{public_url}/v1/domain-transfers/stop/{stop_token}"
    assert t.cooloff_until is not None
    text = (
        f"{t.target_email} accepted the transfer of {t.domain_name}.\n\n"
        f"The domain moves to their workspace on {_when(t.cooloff_until)}. If you did not"
        " mean this, stop the transfer before then by POSTing to this link (it works once):\n\n"
        f"    {stop}\n\n"
        f"    curl -X POST {stop}\n"
    )
    return Notice(source_email, f"Transfer of {t.domain_name} accepted: 24 hours to stop it", text)


def declined_notice(t: Transfer, source_email: str) -> Notice:
    """To the sender: the recipient declined."""
    text = (
        f"{t.target_email} declined the transfer of {t.domain_name}. The domain stays in"
        " your workspace; you may start a new transfer at any time.\n"
    )
    return Notice(source_email, f"Transfer of {t.domain_name} declined", text)
