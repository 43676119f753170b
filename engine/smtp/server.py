"""The server side of SMTP as a sans-I/O state machine (RFC 5321, 2920, 3207, 4954, 1870,
6531).

Feed it what the client sent (`receive_data`), take events out (`next_event`), answer the
requests among them (`respond`) and send what `data_to_send` hands back; the caller moves
the bytes. No socket, no Trio, no clock: timeouts, TLS and limits on connections belong to
the driver (relay/connection.py).

Events. Requests need a decision and exactly one `respond` before the next event:
`AuthAttempt`, `MailFrom`, `RcptTo`, `MessageData`. Notices are already answered:
`StartTlsRequested` (send the 220, wrap the stream in TLS, call `tls_started`),
`MessageRefused` (the data broke a rule; counted by the driver), `Quit` and `Closed` (send
what is left and close). Everything else (EHLO, RSET, NOOP, syntax and sequence errors,
the AUTH exchange) the machine answers itself.

Rules that keep it safe:
- Lines end in CRLF only. A bare CR or LF in a command line is refused (500); in message
  data it makes the whole message refused (554) at its real end. Only CRLF "." CRLF ends
  the data, so `\\n.\\n` or `\\r.\\r\\n` inside a message can never split it in two (SMTP
  smuggling).
- Input is bounded: a command line is at most 512 octets, a data line 1000 (RFC 5321
  4.5.3.1), a message `max_message_size` (advertised with SIZE; over it the data is
  discarded as it arrives and the message refused with 552).
- After STARTTLS nothing already received is executed (CVE-2011-0411): the buffer is
  dropped, and input is ignored until `tls_started`, which resets the session to before
  EHLO.
- AUTH is offered and accepted only under TLS unless the policy allows it in plaintext.
- A connection cannot be kept open by talk alone: more than `MAX_JUNK` commands that move
  no mail between two accepted messages end it with 421, as `MAX_ERRORS` refusals do.
"""

from __future__ import annotations

import base64
import binascii
import enum
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar, Final

import idna

from engine.smtp.client import NEED_DATA as NEED_DATA
from engine.smtp.client import NeedData as NeedData
from engine.smtp.replies import (
    S214_HELP,
    S221_BYE,
    S250_OK,
    S250_RESET,
    S252_CANNOT_VRFY,
    S334_AUTH_CONTINUE,
    S334_PASSWORD,
    S334_USERNAME,
    S354_START_DATA,
    S421_TOO_MANY_COMMANDS,
    S421_TOO_MANY_ERRORS,
    S452_TOO_MANY_RECIPIENTS,
    S454_TLS_UNAVAILABLE,
    S500_BARE_LINE_ENDING,
    S500_LINE_TOO_LONG,
    S500_UNRECOGNIZED,
    S501_AUTH_CANCELLED,
    S501_AUTH_MALFORMED,
    S501_SYNTAX,
    S502_NOT_IMPLEMENTED,
    S503_ALREADY_AUTHENTICATED,
    S503_AUTH_IN_TRANSACTION,
    S503_HELLO_FIRST,
    S503_MAIL_FIRST,
    S503_NESTED_MAIL,
    S503_TLS_ACTIVE,
    S504_AUTH_MECHANISM,
    S530_AUTH_REQUIRED,
    S530_STARTTLS_FIRST,
    S535_AUTH_FAILED,
    S552_SIZE_DECLARED,
    S552_TOO_BIG,
    S553_BAD_ADDRESS,
    S553_NEEDS_SMTPUTF8_PARAMETER,
    S554_BARE_LINE_ENDING_DATA,
    S554_DATA_LINE_TOO_LONG,
    S554_NO_VALID_RECIPIENTS,
    S555_BAD_PARAMS,
    SmtpReply,
)

MAX_COMMAND_LINE = 512  # octets with CRLF (RFC 5321 4.5.3.1.4)
MAX_DATA_LINE = 1000  # octets with CRLF (4.5.3.1.6)
MAX_ERRORS = 20  # refused commands before the server hangs up (421)
# Commands that move no mail (NOOP, RSET, VRFY, HELP, EHLO/HELO, unknown ones) allowed
# between two accepted messages: they only keep a connection open. Postfix starts counting
# them as errors after 100 (smtpd_junk_command_limit); 20 leaves a real client ample room.
MAX_JUNK = 20

# A path: "<" then no angle brackets, spaces or controls, ">" (a source route "@a,@b:" is
# allowed and ignored, RFC 5321 3.3). UTF-8 in the local part is allowed by SMTPUTF8
# (RFC 6531 3.3), checked per transaction; octets that are not UTF-8 arrive as surrogates
# (`_next_line`), which no path takes. A domain may be given in U-labels under SMTPUTF8
# (RFC 6531 3.3); it is taken as its A-labels (`_ascii_domain`), as DNS and the rest of the
# service know it.
_PATH = re.compile(r"<(?:@[^<>:\s]+:)?([\x21-\x3b\x3d\x3f-\x7e\u00a0-\ud7ff\ue000-\U0010ffff]*)>")
_ADDRESS = re.compile(r"[^@\s]+@[A-Za-z0-9.\u00a0-\ud7ff\ue000-\U0010ffff-]{1,253}|")
_MAX_LOCAL_PART = 64  # octets (RFC 5321 4.5.3.1.1), UTF-8 ones too (RFC 6531 3.3)
_PARAM = re.compile(r"([A-Za-z0-9][A-Za-z0-9-]*)(?:=([\x21-\x3c\x3e-\x7e]+))?", re.ASCII)
_HELO_NAME = re.compile(r"[\x21-\x7e]{1,255}")


def _ascii_domain(address: str) -> str | None:
    """The address with its domain in A-labels (IDNA 2008, UTS 46 non-transitional, as
    email addresses use it); None when a U-label domain is not a valid IDN."""
    local, _, domain = address.rpartition("@")
    if domain.isascii():
        return address
    try:
        return f"{local}@{idna.encode(domain.lower(), uts46=True).decode('ascii')}"
    except (idna.IDNAError, UnicodeError):
        return None


# -- Events ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class AuthAttempt:
    """Request: AUTH with these credentials; answer 235 (`S235_AUTH_OK`) or 535."""

    mechanism: str
    username: str
    password: str


@dataclass(frozen=True, slots=True)
class MailFrom:
    """Request: open a transaction from `address` ("" is the null sender of bounces).
    `size` is what the client declared with SIZE=, if it did; `smtputf8` whether it asked
    for an internationalised transaction (RFC 6531: UTF-8 addresses and header fields);
    `requiretls` whether it asked for REQUIRETLS (RFC 8689; only over TLS, when offered)."""

    address: str
    size: int | None
    smtputf8: bool = False
    requiretls: bool = False


@dataclass(frozen=True, slots=True)
class RcptTo:
    """Request: add `address` to the transaction; a 2xx answer accepts it."""

    address: str


@dataclass(frozen=True, slots=True)
class MessageData:
    """Request: the message content, dot-unstuffed, CRLF line endings, for the accepted
    recipients; answer 250 only once it is stored. The transaction ends either way.
    `data` is what came after the last `take_message_data`: all of it if none was taken.
    `helo` and `protocol` are the session's facts a `Received:` field records (RFC 5321
    4.4): the client's EHLO/HELO name and the RFC 3848 protocol (`ESMTPSA`: EHLO, TLS, AUTH)."""

    mail_from: str
    recipients: tuple[str, ...]
    data: bytes
    smtputf8: bool = False  # the transaction was opened with SMTPUTF8 (RFC 6531)
    helo: str = ""
    protocol: str = "ESMTP"
    requiretls: bool = False  # MAIL had REQUIRETLS (RFC 8689): deliver under verified TLS only


@dataclass(frozen=True, slots=True)
class MessageRefused:
    """Notice: the message data broke a rule and was refused with `reply`."""

    reply: SmtpReply


@dataclass(frozen=True, slots=True)
class StartTlsRequested:
    """Notice: 220 is queued; send it, then do the TLS handshake and call `tls_started`."""


@dataclass(frozen=True, slots=True)
class Quit:
    """Notice: 221 is queued; send it and close the connection."""


@dataclass(frozen=True, slots=True)
class Closed:
    """Notice: the client went away, or the server hung up (421 queued); close."""


Request = AuthAttempt | MailFrom | RcptTo | MessageData
Event = Request | MessageRefused | StartTlsRequested | Quit | Closed


@dataclass(frozen=True, slots=True)
class ServerPolicy:
    """What one listener offers. `auth` offers AUTH PLAIN LOGIN and requires it before MAIL
    (submission); `auth_without_tls` allows it in plaintext (loopback benchmarks only)."""

    hostname: str
    max_message_size: int
    tls_available: bool
    auth: bool = False
    auth_without_tls: bool = False
    max_recipients: int = 1000
    # Offers REQUIRETLS (RFC 8689) over TLS, and takes it on MAIL then only (submission).
    requiretls: bool = False


class ServerState(enum.Enum):
    """Where the conversation is."""

    CONNECTED = "connected"  # greeted (or TLS just started): EHLO/HELO expected
    READY = "ready"  # no transaction
    AUTH = "auth"  # in an AUTH exchange: the next line is a base64 response
    MAIL = "mail"  # MAIL accepted: RCPT expected
    RCPT = "rcpt"  # at least one recipient accepted: more RCPT or DATA
    DATA = "data"  # receiving the message content
    STARTING_TLS = "starting_tls"  # 220 sent: nothing is read until `tls_started`
    CLOSED = "closed"


_S = ServerState

# The conversation's order as data. Command lines are read in CONNECTED, READY, MAIL and
# RCPT (an AUTH exchange reads its own lines; nothing is read while TLS starts or once
# closed). `_OUT_OF_SEQUENCE`: the refusal of a command in a state it does not belong to
# (a state not listed goes on to the command's own checks). `_TAKEN`: the state a command
# moves to once taken (MAIL and RCPT when their request is answered 2xx; RSET only out of
# a transaction, never back before EHLO). The end of the message data, answered or refused,
# ends the transaction (READY); a 421 closes from anywhere.
_OUT_OF_SEQUENCE: Final[Mapping[str, Mapping[ServerState, SmtpReply]]] = {
    "STARTTLS": {_S.CONNECTED: S503_HELLO_FIRST},
    "AUTH": {
        _S.CONNECTED: S503_HELLO_FIRST,
        _S.MAIL: S503_AUTH_IN_TRANSACTION,
        _S.RCPT: S503_AUTH_IN_TRANSACTION,
    },
    "MAIL": {_S.CONNECTED: S503_HELLO_FIRST, _S.MAIL: S503_NESTED_MAIL, _S.RCPT: S503_NESTED_MAIL},
    "RCPT": {_S.CONNECTED: S503_HELLO_FIRST, _S.READY: S503_MAIL_FIRST},
    "DATA": {
        _S.CONNECTED: S503_HELLO_FIRST,
        _S.READY: S503_MAIL_FIRST,
        _S.MAIL: S554_NO_VALID_RECIPIENTS,
    },
}
_TAKEN: Final[Mapping[str, ServerState]] = {
    "EHLO": _S.READY,
    "HELO": _S.READY,
    "STARTTLS": _S.STARTING_TLS,
    "AUTH": _S.AUTH,  # until the exchange's last line (then READY)
    "MAIL": _S.MAIL,
    "RCPT": _S.RCPT,
    "DATA": _S.DATA,
    "RSET": _S.READY,
    "QUIT": _S.CLOSED,
}
_IN_TRANSACTION = (_S.MAIL, _S.RCPT, _S.DATA)  # ended (to READY) by RSET, EHLO or the data


class SmtpServer:
    """One SMTP server connection, from the greeting to QUIT, without the connection."""

    def __init__(self, policy: ServerPolicy, *, tls_active: bool = False) -> None:
        self._policy = policy
        self._state = _S.CONNECTED
        self._buffer = bytearray()
        self._outgoing = bytearray()
        self._eof = False
        self._skipping_line = False  # discarding the rest of an over-long command line
        self._errors = 0
        self._junk = 0  # commands that moved no mail since the last accepted message
        self._tls_active = tls_active
        self._authenticated: str | None = None
        self._helo_name = ""  # the client's last EHLO/HELO name
        self._extended = True  # whether that was EHLO
        self._pending: Request | None = None
        self._auth_step: tuple[str, str | None] | None = None  # (mechanism, username so far)
        self._mail_from = ""
        self._smtputf8 = False  # the open transaction's MAIL had SMTPUTF8
        self._requiretls = False  # the open transaction's MAIL had REQUIRETLS
        self._recipients: list[str] = []
        self._data = _DataReader(policy.max_message_size)
        self._queue(SmtpReply.of(220, f"{policy.hostname} ESMTP Postroom"))

    @property
    def state(self) -> ServerState:
        return self._state

    @property
    def tls_active(self) -> bool:
        return self._tls_active

    @property
    def authenticated_as(self) -> str | None:
        """The username of the accepted AUTH, or None."""
        return self._authenticated

    # -- bytes in and out ----------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        """Add bytes received from the client; ``b""`` when the client closed."""
        if not data:
            self._eof = True
        elif self._state not in (_S.STARTING_TLS, _S.CLOSED):
            self._buffer += data

    def data_to_send(self) -> bytes:
        """The replies queued so far, in order (empty when there are none)."""
        out = bytes(self._outgoing)
        self._outgoing.clear()
        return out

    def tls_started(self) -> None:
        """The TLS handshake after STARTTLS succeeded: a fresh session (RFC 3207 4.2)."""
        if self._state is not _S.STARTING_TLS:
            raise RuntimeError("tls_started without a STARTTLS")
        self._buffer.clear()
        self._tls_active = True
        self._authenticated = None
        self._reset()
        self._state = _S.CONNECTED

    @property
    def message_bytes_held(self) -> int:
        """Octets of the message being received that the machine holds (0 outside DATA)."""
        return self._data.held if self._state is _S.DATA else 0

    def take_message_data(self) -> bytes:
        """During DATA: the message content received so far, handed over (to be spooled);
        the machine keeps none of it, and `MessageData` carries only what follows."""
        return self._data.take() if self._state is _S.DATA else b""

    def close_with(self, reply: SmtpReply) -> None:
        """The server hangs up with `reply` (a 421: time-out, shutting down, too busy)."""
        self._queue(reply)
        self._state = _S.CLOSED

    # -- events --------------------------------------------------------------------------

    def next_event(self) -> Event | NeedData:
        """The next event, or `NEED_DATA`. RuntimeError if a request is still unanswered."""
        if self._pending is not None:
            raise RuntimeError(f"answer {type(self._pending).__name__} before the next event")
        while True:
            if self._state is _S.CLOSED:
                return Closed()
            if self._state is _S.STARTING_TLS:
                return NEED_DATA
            event: Event | None
            if self._state is _S.DATA:
                data_event = self._next_data_event()
                if isinstance(data_event, NeedData):
                    return NEED_DATA
                event = data_event
            else:
                line = self._next_line()
                if line is None:
                    if self._eof:
                        self._state = _S.CLOSED
                        return Closed()
                    return NEED_DATA
                event = self._on_line(line)
            if event is not None:
                if isinstance(event, AuthAttempt | MailFrom | RcptTo | MessageData):
                    self._pending = event
                return event

    def respond(self, reply: SmtpReply) -> None:
        """Answer the pending request; its outcome follows the reply's class."""
        request, self._pending = self._pending, None
        if request is None:
            raise RuntimeError("no request to answer")
        self._queue(reply)
        if isinstance(request, AuthAttempt):
            if reply.is_success:
                self._authenticated = request.username
            else:
                self._error()
        elif isinstance(request, MailFrom) and reply.is_success:
            self._mail_from = request.address
            self._smtputf8 = request.smtputf8
            self._requiretls = request.requiretls
            self._state = _TAKEN["MAIL"]
        elif isinstance(request, RcptTo) and reply.is_success:
            self._recipients.append(request.address)
            self._state = _TAKEN["RCPT"]
        elif isinstance(request, MessageData):
            self._reset()
            if reply.is_success:
                self._junk = 0
        if reply.code == 421:
            self._state = _S.CLOSED

    # -- command lines -------------------------------------------------------------------

    def _next_line(self) -> str | None:
        """The next command line without its CRLF; refusals of bad lines are queued."""
        while self._state not in (_S.CLOSED, _S.STARTING_TLS):
            end = self._buffer.find(b"\n")
            if end < 0:
                if len(self._buffer) >= MAX_COMMAND_LINE:
                    # Answer once, then drop everything up to the line's end.
                    if not self._skipping_line:
                        self._refuse(S500_LINE_TOO_LONG)
                    self._skipping_line = True
                    self._buffer.clear()
                return None
            raw = bytes(self._buffer[: end + 1])
            del self._buffer[: end + 1]
            if self._skipping_line:
                self._skipping_line = False
                continue
            if len(raw) > MAX_COMMAND_LINE:
                self._refuse(S500_LINE_TOO_LONG)
            elif not raw.endswith(b"\r\n") or b"\r" in raw[:-2]:
                self._refuse(S500_BARE_LINE_ENDING)
            else:
                # Octets that are not UTF-8 become surrogates, which no argument accepts.
                return raw[:-2].decode("utf-8", "surrogateescape")
        return None

    def _on_line(self, line: str) -> Event | None:
        if self._state is _S.AUTH:
            return self._auth_response(line)
        verb, _, argument = line.partition(" ")
        verb = verb.upper()
        argument = argument.strip()
        handler = self._HANDLERS.get(verb)
        if handler is None or verb in _JUNK:
            self._junk += 1
            if self._junk > MAX_JUNK:
                self.close_with(S421_TOO_MANY_COMMANDS)
                return None
        if handler is None:
            self._refuse(S500_UNRECOGNIZED)
            return None
        return handler(self, argument)

    def _hello(self, argument: str, *, extended: bool) -> None:
        if not _HELO_NAME.fullmatch(argument):
            self._refuse(S501_SYNTAX)
            return
        self._reset()
        self._state = _TAKEN["EHLO" if extended else "HELO"]
        self._helo_name, self._extended = argument, extended
        if not extended:
            self._queue(SmtpReply.of(250, self._policy.hostname))
            return
        lines = [
            self._policy.hostname,
            "PIPELINING",
            f"SIZE {self._policy.max_message_size}",
            "8BITMIME",
            "ENHANCEDSTATUSCODES",
            "SMTPUTF8",
        ]
        if self._policy.tls_available and not self._tls_active:
            lines.append("STARTTLS")
        if self._auth_offered():
            lines.append("AUTH PLAIN LOGIN")
        if self._requiretls_offered():
            lines.append("REQUIRETLS")
        self._queue(SmtpReply(250, tuple(lines)))

    def _ehlo(self, argument: str) -> None:
        self._hello(argument, extended=True)

    def _helo(self, argument: str) -> None:
        self._hello(argument, extended=False)

    def _requiretls_offered(self) -> bool:
        # RFC 8689 4.1: only once TLS is active, as a server offering it then must.
        return self._policy.requiretls and self._tls_active

    def _auth_offered(self) -> bool:
        return self._policy.auth and (self._tls_active or self._policy.auth_without_tls)

    def _starttls(self, argument: str) -> Event | None:
        if argument:
            self._refuse(S501_SYNTAX)
        elif self._tls_active:
            self._refuse(S503_TLS_ACTIVE)
        elif not self._policy.tls_available:
            self._refuse(S454_TLS_UNAVAILABLE)
        elif not self._out_of_sequence("STARTTLS"):
            self._queue(SmtpReply.of(220, "2.0.0 Ready to start TLS"))
            self._buffer.clear()  # pipelined after STARTTLS: never executed
            self._state = _TAKEN["STARTTLS"]
            return StartTlsRequested()
        return None

    def _auth(self, argument: str) -> Event | None:
        mechanism, _, initial = argument.partition(" ")
        mechanism = mechanism.upper()
        if not self._policy.auth:
            self._refuse(S502_NOT_IMPLEMENTED)
        elif not self._auth_offered():
            self._refuse(S530_STARTTLS_FIRST)
        elif self._authenticated is not None:  # only ever after EHLO (TLS forgets it)
            self._refuse(S503_ALREADY_AUTHENTICATED)
        elif self._out_of_sequence("AUTH"):
            return None
        elif mechanism not in ("PLAIN", "LOGIN"):
            self._refuse(S504_AUTH_MECHANISM)
        elif not initial:
            self._auth_step = (mechanism, None)
            self._state = _TAKEN["AUTH"]
            self._queue(S334_AUTH_CONTINUE if mechanism == "PLAIN" else S334_USERNAME)
        else:
            self._auth_step = (mechanism, None)
            self._state = _TAKEN["AUTH"]
            return self._auth_response(initial.strip())
        return None

    def _auth_response(self, line: str) -> Event | None:
        """One base64 line of the AUTH exchange (or an initial response)."""
        assert self._auth_step is not None
        mechanism, username = self._auth_step
        self._state = _S.READY
        self._auth_step = None
        if line == "*":
            self._refuse(S501_AUTH_CANCELLED)
            return None
        decoded = _b64(line)
        if decoded is None:
            self._refuse(S501_AUTH_MALFORMED)
            return None
        if mechanism == "PLAIN":
            parts = decoded.split("\x00")
            # authzid NUL authcid NUL passwd; acting as someone else is not supported.
            if len(parts) != 3 or parts[0] not in ("", parts[1]):
                self._refuse(S535_AUTH_FAILED)
                return None
            return AuthAttempt("PLAIN", parts[1], parts[2])
        if username is None:
            self._auth_step = ("LOGIN", decoded)
            self._state = _TAKEN["AUTH"]
            self._queue(S334_PASSWORD)
            return None
        return AuthAttempt("LOGIN", username, decoded)

    def _mail(self, argument: str) -> Event | None:
        if self._out_of_sequence("MAIL"):
            return None
        if self._policy.auth and self._authenticated is None:
            self._refuse(S530_STARTTLS_FIRST if not self._auth_offered() else S530_AUTH_REQUIRED)
            return None
        parsed = self._path_argument(argument, "FROM:")
        if parsed is None:
            return None
        address, params = parsed
        size: int | None = None
        smtputf8 = requiretls = False
        for name, value in params:
            if name == "SIZE" and value is not None and value.isdigit() and len(value) < 20:
                size = int(value)
            elif name == "SMTPUTF8" and value is None:
                smtputf8 = True
            elif name == "REQUIRETLS" and value is None and self._requiretls_offered():
                requiretls = True
            elif name == "BODY" and value is not None and value.upper() in ("7BIT", "8BITMIME"):
                continue
            elif name == "AUTH" and value is not None:
                continue  # RFC 4954 5: the submitter's identity is ours to decide
            else:
                self._refuse(S555_BAD_PARAMS)
                return None
        if size is not None and size > self._policy.max_message_size:
            self._refuse(S552_SIZE_DECLARED)
            return None
        if not (smtputf8 or address.isascii()):
            self._refuse(S553_NEEDS_SMTPUTF8_PARAMETER)
            return None
        if (ascii_domain := _ascii_domain(address)) is None:
            self._refuse(S553_BAD_ADDRESS)
            return None
        return MailFrom(ascii_domain, size, smtputf8, requiretls)

    def _rcpt(self, argument: str) -> Event | None:
        if self._out_of_sequence("RCPT"):
            return None
        parsed = self._path_argument(argument, "TO:")
        if parsed is None:
            return None
        address, params = parsed
        if params:
            self._refuse(S555_BAD_PARAMS)
            return None
        if not address:
            self._refuse(S553_BAD_ADDRESS)
            return None
        if not (self._smtputf8 or address.isascii()):
            self._refuse(S553_NEEDS_SMTPUTF8_PARAMETER)
            return None
        if (ascii_domain := _ascii_domain(address)) is None:
            self._refuse(S553_BAD_ADDRESS)
            return None
        if len(self._recipients) >= self._policy.max_recipients:
            self._queue(S452_TOO_MANY_RECIPIENTS)
            return None
        return RcptTo(ascii_domain)

    def _path_argument(
        self, argument: str, keyword: str
    ) -> tuple[str, list[tuple[str, str | None]]] | None:
        """The address and ESMTP parameters of MAIL or RCPT (refusal queued if malformed)."""
        if argument[: len(keyword)].upper() != keyword:
            self._refuse(S501_SYNTAX)
            return None
        rest = argument[len(keyword) :].lstrip()
        match = _PATH.match(rest)
        if (
            match is None
            or not _ADDRESS.fullmatch(match[1])
            or len(match[1].rpartition("@")[0].encode()) > _MAX_LOCAL_PART
        ):
            self._refuse(S553_BAD_ADDRESS)
            return None
        params: list[tuple[str, str | None]] = []
        for word in rest[match.end() :].split():
            param = _PARAM.fullmatch(word)
            if param is None:
                self._refuse(S555_BAD_PARAMS)
                return None
            params.append((param[1].upper(), param[2]))
        return match[1], params

    def _data_command(self, argument: str) -> Event | None:
        if argument:
            self._refuse(S501_SYNTAX)
        elif not self._out_of_sequence("DATA"):
            self._queue(S354_START_DATA)
            self._data.start()
            self._state = _TAKEN["DATA"]
        return None

    def _rset(self, argument: str) -> None:
        if self._state is not _S.CONNECTED:
            self._state = _TAKEN["RSET"]
        self._reset()
        self._queue(S250_RESET)

    def _noop(self, argument: str) -> None:
        self._queue(S250_OK)

    def _quit(self, argument: str) -> Event:
        self._queue(S221_BYE)
        self._state = _TAKEN["QUIT"]
        return Quit()

    def _vrfy(self, argument: str) -> None:
        self._queue(S252_CANNOT_VRFY)

    def _help(self, argument: str) -> None:
        self._queue(S214_HELP)

    def _not_implemented(self, argument: str) -> None:
        self._refuse(S502_NOT_IMPLEMENTED)

    _HANDLERS: ClassVar[dict[str, Callable[[SmtpServer, str], Event | None]]] = {
        "EHLO": _ehlo,
        "HELO": _helo,
        "STARTTLS": _starttls,
        "AUTH": _auth,
        "MAIL": _mail,
        "RCPT": _rcpt,
        "DATA": _data_command,
        "RSET": _rset,
        "NOOP": _noop,
        "QUIT": _quit,
        "VRFY": _vrfy,
        "HELP": _help,
        "EXPN": _not_implemented,
        "BDAT": _not_implemented,
    }

    # -- message data --------------------------------------------------------------------

    def _next_data_event(self) -> Event | NeedData:
        finished = self._data.feed(self._buffer)
        if finished is None:
            if self._eof:
                self._state = _S.CLOSED
                return Closed()
            return NEED_DATA
        data, problem = finished
        if problem is not None:
            self._queue(problem)
            self._reset()
            return MessageRefused(problem)
        return MessageData(
            self._mail_from,
            tuple(self._recipients),
            data,
            self._smtputf8,
            self._helo_name,
            self._protocol(),
            self._requiretls,
        )

    # -- helpers -------------------------------------------------------------------------

    def _out_of_sequence(self, verb: str) -> bool:
        """Whether `verb` does not belong in this state (`_OUT_OF_SEQUENCE`): refused if so."""
        refusal = _OUT_OF_SEQUENCE[verb].get(self._state)
        if refusal is not None:
            self._refuse(refusal)
        return refusal is not None

    def _protocol(self) -> str:
        """The RFC 3848 name of this session's protocol, for a `Received:` field."""
        if not self._extended:
            return "SMTP"
        return "ESMTP" + ("S" if self._tls_active else "") + ("A" if self._authenticated else "")

    def _reset(self) -> None:
        self._mail_from = ""
        self._smtputf8 = False
        self._requiretls = False
        self._recipients = []
        if self._state in _IN_TRANSACTION:
            self._state = _S.READY

    def _queue(self, reply: SmtpReply) -> None:
        self._outgoing += reply.to_bytes()

    def _refuse(self, reply: SmtpReply) -> None:
        self._queue(reply)
        self._error()

    def _error(self) -> None:
        self._errors += 1
        if self._errors >= MAX_ERRORS:
            self.close_with(S421_TOO_MANY_ERRORS)


_JUNK = frozenset({"NOOP", "RSET", "VRFY", "HELP", "EHLO", "HELO", "EXPN", "BDAT"})


def _b64(line: str) -> str | None:
    if line == "=":  # an empty initial response (RFC 4954 4)
        return ""
    try:
        return base64.b64decode(line, validate=True).decode("utf-8")
    except (binascii.Error, UnicodeDecodeError, ValueError):
        return None


class _DataReader:
    """Frames message data: finds the CRLF "." CRLF that ends it, unstuffs dots, and checks
    line endings, line lengths and the size, a whole run of complete lines at a time (C
    speed, not a Python loop per line). After a problem the rest is read and discarded.
    """

    def __init__(self, max_size: int) -> None:
        self._max_size = max_size
        self.start()

    def start(self) -> None:
        self._parts: list[bytes] = []
        self.held = 0  # octets in _parts
        self._size = 0
        self._problem: SmtpReply | None = None
        self._line_start = True  # the buffer starts at the beginning of a line

    def feed(self, buffer: bytearray) -> tuple[bytes, SmtpReply | None] | None:
        """Consume from `buffer` what can be; the message and its problem once it ended."""
        if self._line_start and buffer.startswith(b".\r\n"):
            end, after = 0, 3
        else:
            found = buffer.find(b"\r\n.\r\n")
            end, after = (found + 2, found + 5) if found >= 0 else (-1, -1)
        if end >= 0:
            self._take(bytes(buffer[:end]))
            del buffer[:after]
            data = self.take()
            problem = self._problem
            self.start()
            return data, problem
        last = buffer.rfind(b"\r\n")
        if last >= 0:
            self._take(bytes(buffer[: last + 2]))
            del buffer[: last + 2]
            self._line_start = True
        if len(buffer) > MAX_DATA_LINE:
            # No CRLF for a whole line: too long. Keep the last octet (it may be the CR of
            # the CRLF that ends the data) and drop the rest.
            self._fail(S554_DATA_LINE_TOO_LONG)
            del buffer[:-1]
            self._line_start = False
        return None

    def _take(self, lines: bytes) -> None:
        """Check and keep a run of complete lines (each ending in CRLF)."""
        if not lines:
            return
        if self._problem is None:
            crlf = lines.count(b"\r\n")
            if lines.count(b"\r") != crlf or lines.count(b"\n") != crlf:
                self._fail(S554_BARE_LINE_ENDING_DATA)
            elif max(map(len, lines.split(b"\r\n"))) > MAX_DATA_LINE - 2:
                self._fail(S554_DATA_LINE_TOO_LONG)
        self._size += len(lines)
        if self._size > self._max_size:
            self._fail(S552_TOO_BIG)
        if self._problem is not None:
            return
        # RFC 5321 4.5.2: a line's leading dot was doubled by the client; take one away.
        unstuffed = lines.replace(b"\r\n.", b"\r\n")
        if self._line_start and unstuffed.startswith(b"."):
            unstuffed = unstuffed[1:]
        self._parts.append(unstuffed)
        self.held += len(unstuffed)

    def take(self) -> bytes:
        """The unstuffed data kept so far, handed over and forgotten."""
        data = self._parts[0] if len(self._parts) == 1 else b"".join(self._parts)
        self._parts = []
        self.held = 0
        return data

    def _fail(self, problem: SmtpReply) -> None:
        if self._problem is None:
            self._problem = problem
        self._parts = []
        self.held = 0
