"""The submission relay (POSTROOM_SUBMISSION_LISTEN, 587 in production): STARTTLS, AUTH
with an SMTP credential (failures limited per username and client address: 454), then mail
from the credential's domain, under the API's rules. REQUIRETLS (RFC 8689) is offered over
TLS; an email submitted with it is delivered only under verified TLS (engine/smtp/session.py).

Thin: each step asks one engine function (engine/accounts/smtp_credentials.py to authenticate,
engine/sending/submission.py for senders, suppressions, the plan and storing) and turns its answer
into a reply. 250 to the message comes only after it is committed, under a `Received:`
field (engine/mail/trace.py) naming the client's HELO, confirmed reverse DNS and address. A credential deactivated
while a session is open gets 535 at its next MAIL FROM (`submission.current`).
"""

from __future__ import annotations

import ssl

from engine.mail import trace
from engine.platform.runtime import Runtime
from engine.sending import submission
from engine.smtp.replies import (
    S235_AUTH_OK,
    S250_RECIPIENT_OK,
    S250_SENDER_OK,
    S454_TOO_MANY_AUTH_FAILURES,
    S535_AUTH_FAILED,
    SmtpReply,
)
from engine.smtp.server import AuthAttempt, MailFrom, MessageData, RcptTo, ServerPolicy
from relay.client_name import ClientName
from relay.connection import Timeouts
from relay.listener import MAX_PER_CLIENT, Address, SmtpListener

# What a base64-encoded message with 24 MiB of attachments (the API's cap) needs, and more.
MAX_MESSAGE_SIZE = 40 * 1024 * 1024


def _refused(reason: str) -> SmtpReply:
    """550 5.7.1 with the engine's sentence (one line, no CR or LF)."""
    return SmtpReply.of(550, "5.7.1 " + " ".join(reason.split()))


class SubmissionSession:
    """One client connection's decisions; the credential it authenticated as."""

    def __init__(self, rt: Runtime, client: str) -> None:
        self._rt = rt
        self._client = client  # the peer address, for the limits on failed AUTH
        self._submitter: submission.Submitter | None = None
        self._client_name = ClientName(rt, client)

    async def authenticate(self, event: AuthAttempt) -> SmtpReply:
        submitter = await submission.authenticate(
            self._rt, event.username, event.password, self._client
        )
        if submitter is None:
            return S535_AUTH_FAILED  # the same for unknown, wrong and deactivated
        if isinstance(submitter, submission.TooManyFailures):
            return S454_TOO_MANY_AUTH_FAILURES
        self._submitter = submitter
        return S235_AUTH_OK

    async def mail_from(self, event: MailFrom) -> SmtpReply:
        # The machine requires AUTH before MAIL here, so None means the credential was
        # deactivated since (on any node): this session may send nothing more.
        if self._submitter is not None:
            self._submitter = await submission.current(self._rt, self._submitter)
        if self._submitter is None:
            return S535_AUTH_FAILED
        problem = submission.check_sender(self._submitter, event.address)
        return S250_SENDER_OK if problem is None else _refused(problem)

    async def rcpt_to(self, event: RcptTo) -> SmtpReply:
        assert self._submitter is not None
        problem = await submission.check_recipient(self._rt, self._submitter, event.address)
        return S250_RECIPIENT_OK if problem is None else _refused(problem)

    async def message(self, event: MessageData) -> SmtpReply:
        assert self._submitter is not None
        arrival = trace.Arrival(
            event.helo, self._client, await self._client_name.get(), event.protocol
        )
        outcome = await submission.submit(
            self._rt,
            self._submitter,
            event.mail_from,
            list(event.recipients),
            event.data,
            arrival,
            requiretls=event.requiretls,
        )
        if isinstance(outcome, str):
            return _refused(outcome)
        if isinstance(outcome, submission.KeyConflict):
            return SmtpReply.of(550, "5.7.0 " + outcome.reason)
        return SmtpReply.of(250, f"2.0.0 Queued as {outcome.email_id}")


def submission_listener(
    rt: Runtime,
    address: Address,
    tls: ssl.SSLContext | None,
    *,
    auth_without_tls: bool = False,
    max_per_client: int = MAX_PER_CLIENT,
    timeouts: Timeouts | None = None,
) -> SmtpListener:
    """The submission listener. `auth_without_tls` lets AUTH through in plaintext: only for
    a loopback benchmark, never in production (passwords would cross the wire in clear);
    such a benchmark also raises `max_per_client`, its clients all being 127.0.0.1."""
    policy = ServerPolicy(
        hostname=rt.smtp_host,
        max_message_size=MAX_MESSAGE_SIZE,
        tls_available=tls is not None,
        auth=True,
        auth_without_tls=auth_without_tls,
        requiretls=True,
    )
    return SmtpListener(
        "submission",
        address,
        policy,
        lambda client: SubmissionSession(rt, client),
        tls=tls,
        max_per_client=max_per_client,
        timeouts=timeouts,
        memory=rt.message_memory,
    )
