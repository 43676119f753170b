"""Errors of the SMTP client, named by who is to blame and what the caller should do.

Flat and few. The sans-I/O machine raises only `ProtocolError` (for what the server sent)
and the built-in `ValueError` (a command that must not be sent, such as an address with a
line break) or `RuntimeError` (a command out of sequence: a bug in the driver). The Trio
driver translates everything foreign at its edge (OSError, trio's stream errors, timeouts,
TLS errors, `ProtocolError`) into `TransientFailure`, so a caller deciding between "retry
later" and "bounce" needs to catch only `TransientFailure` and `PermanentFailure`.
Replies to individual recipients are results, not errors: see `TransferResult`.
"""

from __future__ import annotations

from engine.smtp.replies import SmtpReply


class SmtpError(Exception):
    """Base of the errors below. ``reply`` is the server's reply that ended the attempt, or
    None when there was none (a broken connection, a timeout, a reply breaking the grammar)."""

    def __init__(self, message: str, reply: SmtpReply | None = None) -> None:
        super().__init__(message)
        self.reply = reply


class ProtocolError(SmtpError):
    """Raised by the client machine when the server breaks the SMTP grammar.

    A malformed or over-long reply line, a reply of more than 100 lines, continuation lines
    with different codes, a reply of the wrong class for its command (354 to MAIL), a reply
    nobody asked for, or the connection closing in the middle of a reply.
    """


class TransientFailure(SmtpError):
    """Raised when the attempt failed for now and may succeed later, on a new connection.

    When: the server greeted or answered EHLO/HELO with 4xx, or answered anything with 421;
    the connection could not be opened or broke; a reply did not come within its timeout;
    the TLS handshake failed (the caller may retry without TLS); the server broke the
    protocol. ``reply`` is the server's reply when there was one, else None. The session
    that raised it is unusable; close it.
    """

    def __init__(self, reply: SmtpReply | None, message: str | None = None) -> None:
        super().__init__(
            message or (str(reply) if reply is not None else "transient failure"), reply
        )


class TlsFailure(TransientFailure):
    """Raised when the STARTTLS handshake (or the greeting over TLS) failed; the caller may
    connect again without TLS (opportunistic TLS, Postfix's `may` level)."""


class PermanentFailure(SmtpError):
    """Raised when the server refused the whole connection for good: a 5xx greeting (554),
    or 5xx to both EHLO and HELO. Every recipient routed to this server fails with ``reply``.
    """

    reply: SmtpReply

    def __init__(self, reply: SmtpReply, message: str | None = None) -> None:
        super().__init__(message or str(reply), reply)
