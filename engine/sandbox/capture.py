"""The sandbox egress: the outgoing mail of sandboxed workspaces, answered by the sandbox,
not an MX.

The delivery router's routes (engine/delivery/egress.py) offer each round's transfers to this
egress before the SMTP egress, before any MX is looked up; it takes those of workspaces in
sandbox mode, which never reach the network. postroom/service.py gives it to the router:
delivery does not know the sandbox. Each of their recipients is answered by its script
(engine/sandbox/scripts.py) through the round's own record, so statuses, events and their
signed webhooks come from the normal engine: a 250 is `delivered`, a 4xx `deferred` on the
real retry schedule, a 5.1.1 `bounced` and suppressed. What recipients accepted is stored as
it would have arrived (the signed bytes, and whether the DKIM signature verifies against the
domain's own key), in one unit with the outcomes they script for later. Like a real
server's 250, a capture stands even if the node dies before the round records its outcomes;
the retry captures it again.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import datetime

import dkim as dkimpy
import trio

from engine.delivery.classify import Replied, Verdict
from engine.delivery.egress import Lanes, Record, Transfer
from engine.domains import dkim_keys
from engine.platform.runtime import Runtime
from engine.sandbox.scripts import answer, script_for
from storage import sandbox
from storage.codec import new_id
from storage.sandbox import Captured, Scheduled, SigningKey


class SandboxEgress:
    """Answers the transfers of sandboxed workspaces (an `egress.Selective`)."""

    def __init__(self, rt: Runtime) -> None:
        self._rt = rt

    async def select(self, transfers: list[Transfer]) -> list[Transfer]:
        """The transfers of sandboxed workspaces."""
        sandboxed, _ = await self._senders(transfers)
        return [t for t in transfers if t.email.workspace_id in sandboxed]

    async def takes(self, email_ids: Collection[str]) -> set[str]:
        return await self._rt.db.read(sandbox.sandboxed_emails, email_ids)

    async def send(self, transfers: list[Transfer], record: Record, lanes: Lanes) -> None:
        """Answer each recipient by its script; store what they accepted."""
        _, keys = await self._senders(transfers)
        await _answer(self._rt, transfers, keys, record)

    async def _senders(self, transfers: list[Transfer]) -> tuple[set[str], dict[str, SigningKey]]:
        """The sandboxed workspaces among the transfers', and their domains' signing keys."""
        workspaces = {t.email.workspace_id for t in transfers}
        domains = {t.email.domain_id for t in transfers}
        return await self._rt.db.read(sandbox.sandboxed_senders, workspaces, domains)


async def _answer(
    rt: Runtime, transfers: Sequence[Transfer], keys: dict[str, SigningKey], record: Record
) -> None:
    clock = rt.clock
    # A slow script holds its transfer as a slow server holds its connection.
    delay = max(
        (script_for(r.address).delay for t in transfers for r in t.recipients), default=None
    )
    if delay:
        # The reply comes when the wait ends: the record stamps `sent` and `delivered` as of
        # each settle, not when the round began.
        await trio.sleep_until(clock.deadline_for(clock.now() + delay))
    now = clock.now()
    accepted: list[tuple[Transfer, list[str]]] = []
    scheduled: list[Scheduled] = []
    for transfer in transfers:
        email, taken = transfer.email, []
        for recipient in transfer.recipients:
            script = script_for(recipient.address)
            reply = answer(script, recipient.address, recipient.attempts)
            # The script's reply is classified as a real server's would be.
            if record.settle(email, recipient, Replied(reply)) is Verdict.DELIVERED:
                taken.append(recipient.address)
                scheduled.extend(
                    Scheduled(
                        new_id(), email.workspace_id, email.id, recipient.address, kind, now + after
                    )
                    for kind, after in script.later
                )
        if taken:
            accepted.append((transfer, taken))
    if not accepted:
        return
    checks = await trio.to_thread.run_sync(
        _dkim_results, [(t.message.data, keys.get(t.email.domain_id)) for t, _ in accepted]
    )
    messages = [
        _captured(transfer, taken, dkim, now)
        for (transfer, taken), dkim in zip(accepted, checks, strict=True)
    ]
    await rt.db.write(sandbox.capture, messages, scheduled, now)


def _captured(transfer: Transfer, taken: list[str], dkim: str, now: datetime) -> Captured:
    email = transfer.email
    return Captured(
        id=new_id(),
        workspace_id=email.workspace_id,
        email_id=email.id,
        envelope_from=transfer.message.envelope_from,
        recipients=taken,
        subject=email.subject,
        dkim=dkim,
        created_at=now,
        data=transfer.message.data,
    )


def _dkim_results(messages: list[tuple[bytes, SigningKey | None]]) -> list[str]:
    return [dkim_result(data, key) for data, key in messages]


def dkim_result(data: bytes, key: SigningKey | None) -> str:
    """`pass` when the message's DKIM signature verifies against the domain's own key (as
    its DNS would publish it), else `fail: <why>`."""
    if key is None:
        return "fail: the sending domain was deleted"
    published = dkim_keys.txt_value(key.public_key).encode()
    name = f"{key.selector}._domainkey.{key.domain}".lower().encode()

    def txt(queried: bytes, timeout: float = 5) -> bytes | None:
        return published if queried.rstrip(b".").lower() == name else None

    try:
        verified = dkimpy.verify(data, dnsfunc=txt)
    except Exception as exc:  # dkimpy raises on a malformed signature; that is the answer
        return f"fail: {type(exc).__name__}: {exc}"
    return "pass" if verified else "fail: the signature does not verify against the domain's key"
