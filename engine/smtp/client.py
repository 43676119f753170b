"""The client side of SMTP as a sans-I/O state machine (RFC 5321, 2920, 3207, 1870, 6152).

Feed it what the server sent (`receive_data`), take replies out (`next_reply`) and ask it
for the bytes of each command (`ehlo`, `mail_from`, ...); the caller moves the bytes. No
socket, no Trio, no clock: timeouts and TLS belong to the driver (`engine.smtp.session`).

Rules. The state says which commands may be sent next (`ClientState`); commands advance it
when they are produced, so a driver may pipeline MAIL, RCPT... and DATA before any reply is
read, and replies are matched to commands in order. Only replies that change what may be
sent next act on the state: the greeting, EHLO/HELO, STARTTLS (a 2xx resets the session:
the driver wraps the stream in TLS and must say EHLO again), a refused MAIL, DATA (354
opens the message content) and 421 (the server is closing). Bad input raises before any
state changes, so a refused command leaves the machine as it was.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

from engine.smtp.errors import ProtocolError
from engine.smtp.grammar import (
    ReplyParser,
    check_helo_name,
    check_path,
    encode_message_parts,
    parse_extensions,
)
from engine.smtp.replies import SmtpReply


class NeedData(enum.Enum):
    """The type of `NEED_DATA`."""

    NEED_DATA = "NEED_DATA"


NEED_DATA: Final = NeedData.NEED_DATA
"""Returned by `SmtpClient.next_reply` until a whole reply has been received."""


class ClientState(enum.Enum):
    """What the client may send next."""

    GREETING = "greeting"  # nothing: the server speaks first
    REFUSED = "refused"  # the greeting was not 2xx: QUIT only
    CONNECTED = "connected"  # greeted, but not (or no longer, after STARTTLS) said EHLO/HELO
    READY = "ready"  # EHLO/HELO accepted, no transaction: MAIL, STARTTLS, RSET, QUIT
    STARTING_TLS = "starting_tls"  # nothing until the STARTTLS reply has been read
    MAIL = "mail"  # MAIL sent: RCPT, RSET, QUIT
    RCPT = "rcpt"  # RCPT sent: RCPT, DATA, RSET, QUIT
    DATA = "data"  # nothing until the DATA reply has been read
    MESSAGE = "message"  # DATA answered 354: the message content, nothing else
    ABORTED = "aborted"  # DATA refused, the server's transaction state unknown: RSET, QUIT
    CLOSED = "closed"  # QUIT sent or 421 received: nothing


class _Command(enum.Enum):
    GREETING = "greeting"
    EHLO = "EHLO"
    HELO = "HELO"
    STARTTLS = "STARTTLS"
    MAIL = "MAIL"
    RCPT = "RCPT"
    DATA = "DATA"
    MESSAGE = "message"
    RSET = "RSET"
    QUIT = "QUIT"


_S = ClientState
_C = _Command
_IDLE = (_S.READY, _S.MAIL, _S.RCPT, _S.ABORTED)  # a transaction may be open, RSET ends it

# The machine as data. `_SENDS`: the states a command may be sent in, and the state it
# moves to as it is produced (before its reply: commands may be pipelined).
_SENDS: Final[Mapping[_Command, tuple[tuple[ClientState, ...], ClientState]]] = {
    _C.EHLO: ((_S.CONNECTED, _S.READY), _S.CONNECTED),
    _C.HELO: ((_S.CONNECTED, _S.READY), _S.CONNECTED),
    _C.STARTTLS: ((_S.READY,), _S.STARTING_TLS),
    _C.MAIL: ((_S.READY,), _S.MAIL),
    _C.RCPT: ((_S.MAIL, _S.RCPT), _S.RCPT),
    _C.DATA: ((_S.RCPT,), _S.DATA),
    _C.MESSAGE: ((_S.MESSAGE,), _S.READY),
    _C.RSET: (_IDLE, _S.READY),
    _C.QUIT: ((_S.REFUSED, _S.CONNECTED, *_IDLE), _S.CLOSED),
}
# `_ON_REPLY`: (the command a reply answers, whether it said yes: 354 for DATA, 2xx for the
# rest) -> the state it moves to, from any state or only from those listed (a refused MAIL
# goes back to READY only when nothing was pipelined after it). A reply not listed leaves
# the state as it is; a 421 closes from anywhere (`next_reply`).
_ON_REPLY: Final[
    Mapping[tuple[_Command, bool], tuple[ClientState, tuple[ClientState, ...] | None]]
] = {
    (_C.GREETING, True): (_S.CONNECTED, None),
    (_C.GREETING, False): (_S.REFUSED, None),
    (_C.EHLO, True): (_S.READY, None),
    (_C.HELO, True): (_S.READY, None),
    (_C.STARTTLS, True): (_S.CONNECTED, None),  # a fresh session over TLS: EHLO again
    (_C.STARTTLS, False): (_S.READY, None),
    (_C.MAIL, False): (_S.READY, (_S.MAIL,)),
    (_C.DATA, True): (_S.MESSAGE, None),
    (_C.DATA, False): (_S.ABORTED, None),
}


class SmtpClient:
    """One SMTP client connection, from the greeting to QUIT, without the connection."""

    def __init__(self) -> None:
        self._state = ClientState.GREETING
        self._parser = ReplyParser()
        self._pending: deque[_Command] = deque([_Command.GREETING])
        self._extensions: dict[str, str] = {}
        self._utf8_transaction = False

    @property
    def state(self) -> ClientState:
        """What may be sent next."""
        return self._state

    @property
    def extensions(self) -> Mapping[str, str]:
        """Extensions from the last accepted EHLO (upper-case keyword -> parameters).

        Empty before EHLO, after HELO and after STARTTLS until the next EHLO.
        """
        return MappingProxyType(self._extensions)

    # -- receiving ---------------------------------------------------------------------

    def receive_data(self, data: bytes | bytearray) -> None:
        """Add bytes received from the server; ``b""`` when the server closed."""
        self._parser.feed(data)

    def next_reply(self) -> SmtpReply | NeedData:
        """The next reply, in the order commands were sent, or `NEED_DATA`.

        Raises `ProtocolError` when the server broke the grammar or the order of replies.
        """
        reply = self._parser.next_reply()
        if reply is None:
            return NEED_DATA
        if reply.code == 421:  # may come instead of any reply, or unasked (RFC 5321 3.8)
            self._pending.clear()
            self._state = ClientState.CLOSED
            return reply
        if not self._pending:
            raise ProtocolError(f"reply nobody asked for: {reply}")
        self._on_reply(self._pending.popleft(), reply)
        return reply

    def _on_reply(self, command: _Command, reply: SmtpReply) -> None:
        success_class = 3 if command is _Command.DATA else 2  # 354 is DATA's only "yes"
        if reply.is_positive and reply.code // 100 != success_class:
            raise ProtocolError(f"reply {reply} does not fit {command.value}")
        yes = reply.code == 354 if command is _Command.DATA else reply.is_success
        if yes and command in (_Command.EHLO, _Command.HELO):
            is_ehlo = command is _Command.EHLO
            self._extensions = parse_extensions(reply) if is_ehlo else {}
        elif yes and command is _Command.STARTTLS:
            # Anything after the 220 arrived in plaintext before the handshake: an
            # attacker's injected replies (the client side of CVE-2011-0411). Drop it.
            self._parser.clear()
            self._extensions = {}
        move = _ON_REPLY.get((command, yes))
        if move is not None and (move[1] is None or self._state in move[1]):
            self._state = move[0]

    # -- sending -----------------------------------------------------------------------

    def ehlo(self, name: str) -> bytes:
        """EHLO with our host name; on a 5xx reply the driver may try `helo` instead."""
        return self._hello(_Command.EHLO, name)

    def helo(self, name: str) -> bytes:
        """HELO, for servers that do not know EHLO; no extensions."""
        return self._hello(_Command.HELO, name)

    def _hello(self, command: _Command, name: str) -> bytes:
        check_helo_name(name)
        self._require(command)
        self._extensions = {}
        return self._send(command, f"{command.value} {name}")

    def starttls(self) -> bytes:
        """STARTTLS; after its 2xx reply, wrap the stream in TLS and send EHLO again."""
        self._require(_Command.STARTTLS)
        return self._send(_Command.STARTTLS, "STARTTLS")

    def mail_from(
        self,
        address: str,
        size: int | None = None,
        *,
        eight_bit: bool = False,
        smtputf8: bool = False,
        requiretls: bool = False,
    ) -> bytes:
        """MAIL FROM, opening a transaction; ``""`` is the null sender of bounces.

        ``size`` becomes SIZE= (RFC 1870) when the server offers SIZE. ``eight_bit`` says
        the message has 8-bit bytes, sent as BODY=8BITMIME when the server offers it (and
        as they are otherwise, as MTAs do). ``smtputf8`` asks for an internationalised
        transaction (RFC 6531), which a non-ASCII address needs; ValueError when it is
        needed but the server does not offer SMTPUTF8, or the address is unfit.
        ``requiretls`` passes REQUIRETLS on (RFC 8689 4.1); ValueError when the server does not
        offer it.
        """
        check_path(address, allow_null=True)
        if requiretls and "REQUIRETLS" not in self._extensions:
            raise ValueError("REQUIRETLS is needed, but the server does not offer it")
        smtputf8 = smtputf8 or not address.isascii()
        if smtputf8 and "SMTPUTF8" not in self._extensions:
            raise ValueError("SMTPUTF8 is needed, but the server does not offer it")
        self._require(_Command.MAIL)
        params = [f"MAIL FROM:<{address}>"]
        if size is not None and "SIZE" in self._extensions:
            params.append(f"SIZE={size:d}")
        if eight_bit and "8BITMIME" in self._extensions:
            params.append("BODY=8BITMIME")
        if requiretls:
            params.append("REQUIRETLS")
        if smtputf8:
            params.append("SMTPUTF8")
        self._utf8_transaction = smtputf8
        return self._send(_Command.MAIL, " ".join(params))

    def rcpt_to(self, address: str) -> bytes:
        """RCPT TO for one recipient; a non-ASCII one needs a ``smtputf8`` transaction."""
        check_path(address)
        if not address.isascii() and not self._utf8_transaction:
            raise ValueError(f"{address!r} needs a transaction opened with smtputf8=True")
        self._require(_Command.RCPT)
        return self._send(_Command.RCPT, f"RCPT TO:<{address}>")

    def data(self) -> bytes:
        """DATA; after its 354 reply, send `message`."""
        self._require(_Command.DATA)
        return self._send(_Command.DATA, "DATA")

    def message(self, data: bytes) -> bytes:
        """The message content, ready to send: CRLF line endings, dot-stuffed, ending in
        CRLF "." CRLF. Its reply (250 or a refusal) ends the transaction either way.
        """
        return b"".join(self.message_parts(data))

    def message_parts(self, data: bytes) -> tuple[bytes, bytes]:
        """`message` as two parts sent one after the other (no joined copy of a large
        message)."""
        self._require(_Command.MESSAGE)
        self._advance(_Command.MESSAGE)
        return encode_message_parts(data)

    def rset(self) -> bytes:
        """RSET, abandoning any transaction."""
        self._require(_Command.RSET)
        return self._send(_Command.RSET, "RSET")

    def quit(self) -> bytes:
        """QUIT; the server answers 221 and closes the connection."""
        self._require(_Command.QUIT)
        return self._send(_Command.QUIT, "QUIT")

    def _require(self, command: _Command) -> None:
        if self._state not in _SENDS[command][0]:
            raise RuntimeError(f"cannot send {command.value} in state {self._state.value}")

    def _advance(self, command: _Command) -> None:
        """`command` is on its way: its reply is awaited, and the state moves (`_SENDS`)."""
        self._pending.append(command)
        self._state = _SENDS[command][1]

    def _send(self, command: _Command, line: str) -> bytes:
        self._advance(command)
        return f"{line}\r\n".encode()
