"""The inbound MX (POSTROOM_INBOUND_LISTEN, 25 in production): mail for forwards, for the
bounce addresses of emails this service sent, and for postmaster@ and abuse@ of the domains
it serves. Never an open relay, no AUTH.

Thin: RCPT asks `engine.inbound.accepts` (550 5.1.1 when the address is not ours), the
message goes to `engine.inbound.receive`, and 250 comes only after it returned (the message
is committed). An `EngineError` there is refused with its detail.
"""

from __future__ import annotations

import ssl

from engine.forwarding import inbound
from engine.mail import trace
from engine.platform.errors import EngineError, PayloadTooLarge
from engine.platform.runtime import Runtime
from engine.smtp.replies import (
    S250_RECIPIENT_OK,
    S250_SENDER_OK,
    S502_NOT_IMPLEMENTED,
    S550_NO_SUCH_USER,
    SmtpReply,
)
from engine.smtp.server import AuthAttempt, MailFrom, MessageData, RcptTo, ServerPolicy
from relay.client_name import ClientName
from relay.connection import Timeouts
from relay.listener import Address, SmtpListener

MAX_MESSAGE_SIZE = 40 * 1024 * 1024


def _refusal(error: EngineError) -> SmtpReply:
    detail = " ".join(error.detail.split())
    if isinstance(error, PayloadTooLarge):
        return SmtpReply.of(552, "5.3.4 " + detail)
    return SmtpReply.of(550, "5.6.0 " + detail)


class InboundSession:
    """One sending MTA's connection."""

    def __init__(self, rt: Runtime, client: str) -> None:
        self._rt = rt
        self._client_name = ClientName(rt, client)  # for the Received: field

    async def authenticate(self, event: AuthAttempt) -> SmtpReply:
        return S502_NOT_IMPLEMENTED  # not offered: the machine answers AUTH itself

    async def mail_from(self, event: MailFrom) -> SmtpReply:
        return S250_SENDER_OK  # anyone may write to a forward; bounces come from <>

    async def rcpt_to(self, event: RcptTo) -> SmtpReply:
        accepted = await inbound.accepts(self._rt, event.address)
        return S250_RECIPIENT_OK if accepted else S550_NO_SUCH_USER

    async def message(self, event: MessageData) -> SmtpReply:
        try:
            recipients = list(event.recipients)
            name = await self._client_name.get() if inbound.stamps(recipients) else None
            arrival = trace.Arrival(event.helo, self._client_name.address, name, event.protocol)
            await inbound.receive(self._rt, event.mail_from, recipients, event.data, arrival)
        except EngineError as error:
            return _refusal(error)
        return SmtpReply.of(250, "2.0.0 Message accepted")


def inbound_listener(
    rt: Runtime, address: Address, tls: ssl.SSLContext | None, *, timeouts: Timeouts | None = None
) -> SmtpListener:
    policy = ServerPolicy(
        hostname=rt.smtp_host, max_message_size=MAX_MESSAGE_SIZE, tls_available=tls is not None
    )
    return SmtpListener(
        "inbound",
        address,
        policy,
        lambda client: InboundSession(rt, client),
        tls=tls,
        timeouts=timeouts,
        memory=rt.message_memory,
    )
