"""SMTP replies: the value type both sides use, and the catalogue of replies Postroom sends.

A reply is a three-digit code and one or more text lines (RFC 5321 4.2). Its class says who
must act: 2xx done, 3xx go on, 4xx try again later (transient), 5xx do not try again
(permanent). The enhanced status code of RFC 3463 (``5.1.1``), when the server gives one,
is read from the first line. Replies that our own code sends or synthesises are named here
once (``S250_OK``), so the server, the client and the tests agree on their exact text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# RFC 3463 2.: class "." subject "." detail; the class must agree with the reply code.
_ENHANCED_STATUS = re.compile(r"([245])\.(\d{1,3})\.(\d{1,3})(?![\d.])")


@dataclass(frozen=True, slots=True)
class SmtpReply:
    """One complete reply: ``code`` and its ``lines`` without code, separator or CRLF."""

    code: int
    lines: tuple[str, ...]

    def __post_init__(self) -> None:
        if not 200 <= self.code <= 599:
            raise ValueError(f"reply code {self.code} is not a 2xx-5xx code")
        if not self.lines:
            raise ValueError("a reply has at least one line")
        if any("\r" in line or "\n" in line for line in self.lines):
            raise ValueError("reply lines must not contain CR or LF")

    @classmethod
    def of(cls, code: int, *lines: str) -> SmtpReply:
        """A reply from its code and text lines: ``SmtpReply.of(250, "2.0.0 OK")``."""
        return cls(code, lines or ("",))

    @property
    def text(self) -> str:
        """All lines joined with newlines, as a person would read them."""
        return "\n".join(self.lines)

    @property
    def enhanced_status(self) -> str | None:
        """The RFC 3463 code that starts the first line ("5.1.1"), or None."""
        match = _ENHANCED_STATUS.match(self.lines[0])
        if match is None or match[1] != str(self.code)[0]:
            return None
        return match[0]

    @property
    def is_success(self) -> bool:
        """2xx: the command was done."""
        return 200 <= self.code < 300

    @property
    def is_positive(self) -> bool:
        """2xx or 3xx: done, or go on (354 after DATA)."""
        return 200 <= self.code < 400

    @property
    def is_transient(self) -> bool:
        """4xx: not now; the same request may succeed later."""
        return 400 <= self.code < 500

    @property
    def is_permanent(self) -> bool:
        """5xx: the same request will fail again; do not retry it."""
        return 500 <= self.code < 600

    def to_bytes(self) -> bytes:
        """The reply as sent on the wire: ``code-`` on all lines but the last (4.2.1)."""
        last = len(self.lines) - 1
        return b"".join(
            f"{self.code}{' ' if i == last else '-'}{line}\r\n".encode()
            for i, line in enumerate(self.lines)
        )

    def __str__(self) -> str:
        return f"{self.code} {' '.join(self.lines)}".rstrip()


# -- The catalogue -----------------------------------------------------------------------
# Greeting and session
S220_READY = SmtpReply.of(220, "Postroom ESMTP ready")
S220_READY_TLS = SmtpReply.of(220, "2.0.0 Ready to start TLS")
S221_BYE = SmtpReply.of(221, "2.0.0 Bye")
S235_AUTH_OK = SmtpReply.of(235, "2.7.0 Authentication successful")
S250_OK = SmtpReply.of(250, "2.0.0 OK")
S250_SENDER_OK = SmtpReply.of(250, "2.1.0 Sender OK")
S250_RECIPIENT_OK = SmtpReply.of(250, "2.1.5 Recipient OK")
S250_QUEUED = SmtpReply.of(250, "2.0.0 Message accepted for delivery")
S334_AUTH_CONTINUE = SmtpReply.of(334, "")
S354_START_DATA = SmtpReply.of(354, "End data with <CR><LF>.<CR><LF>")

# Transient: try again later
S421_SHUTTING_DOWN = SmtpReply.of(421, "4.3.2 Service shutting down, closing channel")
S421_TIMEOUT = SmtpReply.of(421, "4.4.2 Timeout, closing channel")
S421_TOO_MANY_ERRORS = SmtpReply.of(421, "4.7.0 Too many errors, closing channel")
S421_TOO_MANY_COMMANDS = SmtpReply.of(
    421, "4.7.0 Too many commands without a message, closing channel"
)
S450_MAILBOX_BUSY = SmtpReply.of(450, "4.2.0 Mailbox unavailable, try again later")
S451_LOCAL_ERROR = SmtpReply.of(451, "4.3.0 Local error in processing, try again later")
S451_DATABASE_UNAVAILABLE = SmtpReply.of(
    451, "4.3.0 Mail system temporarily unavailable, try again later"
)
S452_TOO_MANY_RECIPIENTS = SmtpReply.of(452, "4.5.3 Too many recipients")
S452_STORAGE_FULL = SmtpReply.of(452, "4.3.1 Insufficient system storage, try again later")
S454_TLS_UNAVAILABLE = SmtpReply.of(454, "4.7.0 TLS not available")
S454_TOO_MANY_AUTH_FAILURES = SmtpReply.of(
    454, "4.7.0 Too many failed authentications, try again later"
)

# Permanent: the client erred or the request is refused for good
S500_UNRECOGNIZED = SmtpReply.of(500, "5.5.2 Command not recognized")
S500_LINE_TOO_LONG = SmtpReply.of(500, "5.5.6 Line too long")
S501_SYNTAX = SmtpReply.of(501, "5.5.4 Syntax error in parameters or arguments")
S502_NOT_IMPLEMENTED = SmtpReply.of(502, "5.5.1 Command not implemented")
S503_BAD_SEQUENCE = SmtpReply.of(503, "5.5.1 Bad sequence of commands")
S504_PARAM_NOT_IMPLEMENTED = SmtpReply.of(504, "5.5.4 Command parameter not implemented")
S530_AUTH_REQUIRED = SmtpReply.of(530, "5.7.0 Authentication required")
S530_STARTTLS_FIRST = SmtpReply.of(530, "5.7.0 Must issue a STARTTLS command first")
S535_AUTH_FAILED = SmtpReply.of(535, "5.7.8 Authentication credentials invalid")
S550_NO_SUCH_USER = SmtpReply.of(550, "5.1.1 No such user")
S550_RELAY_DENIED = SmtpReply.of(550, "5.7.1 Relaying denied")
S552_TOO_BIG = SmtpReply.of(552, "5.3.4 Message size exceeds fixed limit")
S553_BAD_ADDRESS = SmtpReply.of(553, "5.1.3 Bad address syntax")
# Made up by the client, never received: the address has a non-ASCII local part and the
# server does not offer SMTPUTF8 (RFC 6531 3.2), so the message cannot go to it there.
S553_NEEDS_SMTPUTF8 = SmtpReply.of(553, "5.6.7 Non-ASCII address, and the server lacks SMTPUTF8")
# Made up by the client, never received: the message's header has UTF-8 (RFC 6532), the
# server lacks SMTPUTF8 and the header has no ASCII form (engine/mail/international.py).
S554_MESSAGE_NEEDS_SMTPUTF8 = SmtpReply.of(
    554, "5.6.7 The message has UTF-8 header fields, and the server lacks SMTPUTF8"
)
# Made up by the client, never received: a REQUIRETLS message (RFC 8689 5) found no server
# reached over verified TLS (DANE or MTA-STS) that offers REQUIRETLS.
S550_REQUIRETLS_NEEDED = SmtpReply.of(550, "5.7.30 REQUIRETLS support required")
S554_FAILED = SmtpReply.of(554, "5.0.0 Transaction failed")
S554_NO_VALID_RECIPIENTS = SmtpReply.of(554, "5.5.1 No valid recipients")
S554_NO_SERVICE = SmtpReply.of(554, "5.3.2 No SMTP service here")
S555_BAD_PARAMS = SmtpReply.of(
    555, "5.5.4 MAIL FROM/RCPT TO parameters not recognized or not implemented"
)

# -- Replies only the server side sends (engine/smtp/server.py, relay/) ------------------
S214_HELP = SmtpReply.of(
    214, "2.0.0 See RFC 5321; commands: EHLO HELO MAIL RCPT DATA RSET NOOP QUIT"
)
S250_RESET = SmtpReply.of(250, "2.0.0 Reset")
S252_CANNOT_VRFY = SmtpReply.of(252, "2.5.0 Cannot verify the user, but will try to deliver")
S334_USERNAME = SmtpReply.of(334, "VXNlcm5hbWU6")  # base64 "Username:" (AUTH LOGIN)
S334_PASSWORD = SmtpReply.of(334, "UGFzc3dvcmQ6")  # base64 "Password:"
S500_BARE_LINE_ENDING = SmtpReply.of(
    500, "5.5.2 Bare CR or LF in a command line; end every line with CRLF"
)
S501_AUTH_CANCELLED = SmtpReply.of(501, "5.7.0 Authentication cancelled")
S501_AUTH_MALFORMED = SmtpReply.of(501, "5.5.2 Cannot decode the authentication response")
S503_ALREADY_AUTHENTICATED = SmtpReply.of(503, "5.5.1 Already authenticated")
S503_HELLO_FIRST = SmtpReply.of(503, "5.5.1 Say EHLO or HELO first")
S503_MAIL_FIRST = SmtpReply.of(503, "5.5.1 MAIL FROM first")
S503_NESTED_MAIL = SmtpReply.of(503, "5.5.1 A transaction is already open; RSET first")
S503_AUTH_IN_TRANSACTION = SmtpReply.of(503, "5.5.1 AUTH is not allowed during a transaction")
S503_TLS_ACTIVE = SmtpReply.of(503, "5.5.1 TLS is already active")
S504_AUTH_MECHANISM = SmtpReply.of(
    504, "5.5.4 Unrecognized authentication type; use PLAIN or LOGIN"
)
S552_SIZE_DECLARED = SmtpReply.of(552, "5.3.4 Message size exceeds fixed maximum message size")
S553_NEEDS_SMTPUTF8_PARAMETER = SmtpReply.of(
    553, "5.6.7 Non-ASCII address; open the transaction with MAIL FROM:<...> SMTPUTF8"
)
S554_BARE_LINE_ENDING_DATA = SmtpReply.of(
    554, "5.6.0 Message refused: bare CR or LF in the message; end every line with CRLF"
)
S554_DATA_LINE_TOO_LONG = SmtpReply.of(
    554, "5.6.0 Message refused: a line is longer than 1000 octets including CRLF"
)
