"""The Trio driver of the SMTP client: one connection to one server, one or more messages.

`connect` opens the connection (greeting, EHLO or HELO, opportunistic STARTTLS) and returns
an `SmtpSession`; `SmtpSession.send` runs one mail transaction and reports every
recipient's reply in a `TransferResult`. The protocol is decided by `SmtpClient`; this
module only moves bytes and keeps time. Rules: every read and write has a deadline
(RFC 5321 4.5.3.2, shortened); foreign errors are translated here, at the edge, into
`TransientFailure`; after any error the session is unusable and must be closed.
"""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass

import trio

from engine.smtp.client import ClientState, SmtpClient
from engine.smtp.errors import (
    PermanentFailure,
    ProtocolError,
    SmtpError,
    TlsFailure,
    TransientFailure,
)
from engine.smtp.grammar import check_helo_name, check_path, has_utf8_header, to_crlf
from engine.smtp.replies import (
    S550_REQUIRETLS_NEEDED,
    S553_NEEDS_SMTPUTF8,
    S554_MESSAGE_NEEDS_SMTPUTF8,
    SmtpReply,
)

DEFAULT_TIMEOUT = 60.0  # each command's reply, connecting, the TLS handshake
DEFAULT_DATA_TIMEOUT = 120.0  # sending the message content, and the reply to the final dot
_RECEIVE_SIZE = 65536
_SEND_SIZE = 256 * 1024  # octets handed to the stream at once

# Judges the certificates a server presented (DER, leaf first): None to go on, else why not.
ChainCheck = Callable[[list[bytes]], str | None]


@dataclass(frozen=True, slots=True)
class TransferResult:
    """What the server said in one transaction.

    ``mail_reply`` answered MAIL FROM (or was made up locally, `S553_NEEDS_SMTPUTF8`, when
    the transaction could not be started). ``recipient_replies`` holds each recipient's
    RCPT reply, empty when MAIL was refused. ``data_reply`` answered DATA or the message
    content and applies to every accepted recipient; None when no data was sent.
    """

    mail_reply: SmtpReply
    recipient_replies: dict[str, SmtpReply]
    data_reply: SmtpReply | None

    def outcome_for(self, recipient: str) -> SmtpReply:
        """The reply that decides ``recipient``'s fate (one of those passed to `send`):
        its RCPT reply if that refused it, else the data reply, else the MAIL reply.
        """
        reply = self.recipient_replies.get(recipient)
        if reply is not None and not reply.is_success:
            return reply
        if self.data_reply is not None:
            return self.data_reply
        return self.mail_reply


@dataclass(frozen=True, slots=True)
class Peer:
    """Whom a session speaks to, and how: what a delivered event records of it."""

    mx_host: str  # the MX host name (the address itself when there was none)
    address: str
    tls_version: str | None  # None: the conversation is in plaintext
    tls_cipher: str | None
    tls_verified: bool  # the certificate was checked (CAs and MX name, or DANE's TLSA)
    # The TLS policy the session was opened under (engine/platform/tls_counts.py).
    policy: str = "opportunistic"

    def metadata(self) -> dict[str, object]:
        """The event metadata fields (docs: README, Events)."""
        tls = None
        if self.tls_version is not None:
            tls = {
                "version": self.tls_version,
                "cipher": self.tls_cipher,
                "verified": self.tls_verified,
            }
        return {
            "mx_host": self.mx_host,
            "mx_address": self.address,
            "tls": tls,
            "policy": self.policy,
        }


def _presented_chain(stream: trio.SSLStream[trio.abc.Stream]) -> list[bytes]:
    """The certificates the server presented, DER, leaf first. Python 3.13 has it public
    (`SSLObject.get_unverified_chain`); 3.11 only on the private `_sslobj`, as certificate
    objects; the leaf alone when neither is there."""
    ssl_object = stream._ssl_object  # trio forwards no chain accessor
    public = getattr(ssl_object, "get_unverified_chain", None)
    private = getattr(getattr(ssl_object, "_sslobj", None), "get_unverified_chain", None)
    if public is not None:
        return [bytes(der) for der in public() or ()]
    if private is not None:
        return [cert.public_bytes(ssl._ssl.ENCODING_DER) for cert in private() or ()]  # type: ignore[attr-defined]
    leaf = stream.getpeercert(binary_form=True)
    return [] if leaf is None else [leaf]


@contextlib.contextmanager
def _translated(what: str) -> Iterator[None]:
    """Turn foreign errors into `TransientFailure` (httpcore's ``map_exceptions``)."""
    try:
        yield
    except trio.TooSlowError as exc:
        raise TransientFailure(None, f"{what}: timed out") from exc
    except (OSError, trio.BrokenResourceError, ProtocolError) as exc:
        detail = str(exc) or repr(exc.__cause__ or exc)
        raise TransientFailure(None, f"{what}: {detail}") from exc


def _refusal(reply: SmtpReply, what: str) -> SmtpError:
    if reply.is_permanent:
        return PermanentFailure(reply, f"{what}: {reply}")
    return TransientFailure(reply, f"{what}: {reply}")


async def connect(
    host: str,
    port: int,
    *,
    helo_name: str,
    tls: ssl.SSLContext | None,
    timeout: float = DEFAULT_TIMEOUT,  # noqa: ASYNC109 - per command, not for the call
    data_timeout: float = DEFAULT_DATA_TIMEOUT,
    pipelining: bool = True,
    mx_host: str | None = None,
    policy: str | None = None,
    check: ChainCheck | None = None,
    local_address: str | None = None,
) -> SmtpSession:
    """Connect to an SMTP server and greet it; the session is ready to `send`.

    With ``tls``, STARTTLS is used when the server offers it, verifying the certificate
    against ``mx_host`` as the context says (opportunistic: a server that does not offer it is
    spoken to in plaintext; check `SmtpSession.tls_active`). ``timeout`` bounds each step,
    ``data_timeout`` sending the message and its final reply. ``pipelining=False`` never
    pipelines, for servers that offer PIPELINING but mishandle it. ``mx_host`` is the MX
    name ``host`` was found under: the name a verifying ``tls`` checks the certificate
    against, and what `SmtpSession.peer` reports with ``policy``, the TLS policy applied
    (default: ``opportunistic`` with ``tls``, ``none`` without). ``check``, with a ``tls``
    that verifies nothing itself, judges the certificates the server presented (DANE,
    engine/delivery/dane.py) before anything is said over TLS: a refusal is a `TlsFailure`,
    a pass makes the session verified. ``local_address`` binds the connection's source
    address (an egress source, engine/delivery/egress_sources.py); None: the host chooses.

    Raises `TransientFailure` when the server cannot be reached, does not answer in time or
    greets with 4xx; `TlsFailure` (a `TransientFailure`) when the TLS handshake or the
    greeting over TLS fails (the caller may retry with ``tls=None``); `PermanentFailure`
    when it greets with 5xx or refuses both EHLO and HELO.
    """
    check_helo_name(helo_name)
    with _translated(f"connecting to {host}:{port}"), trio.fail_after(timeout):
        stream: trio.abc.Stream = await trio.open_tcp_stream(
            host, port, local_address=local_address
        )
    session = SmtpSession(
        stream, host=host, timeout=timeout, data_timeout=data_timeout, pipelining=pipelining
    )
    session._mx_host = mx_host or host
    session._policy = policy or ("none" if tls is None else "opportunistic")
    try:
        await session._open(helo_name, tls, check)
    except BaseException:
        await trio.aclose_forcefully(session._stream)
        raise
    return session


class SmtpSession(trio.abc.AsyncResource):
    """An open SMTP connection, made by `connect`; close it with `quit` or `aclose`."""

    def __init__(
        self,
        stream: trio.abc.Stream,
        *,
        host: str,
        timeout: float,
        data_timeout: float,
        pipelining: bool,
    ) -> None:
        self._stream = stream
        self._client = SmtpClient()
        self._host = host
        self._timeout = timeout
        self._data_timeout = data_timeout
        self._pipelining = pipelining
        self._tls_active = False
        self._mx_host = host
        self._policy = "none"
        self._tls: tuple[str | None, str | None, bool] = (None, None, False)
        self._broken = False  # commands and replies may be out of step: never reuse

    @property
    def tls_active(self) -> bool:
        """Whether the conversation was upgraded with STARTTLS."""
        return self._tls_active

    @property
    def peer(self) -> Peer:
        """The server's host name and address, and the TLS the session negotiated."""
        version, cipher, verified = self._tls
        return Peer(self._mx_host, self._host, version, cipher, verified, self._policy)

    @property
    def usable(self) -> bool:
        """Whether another transaction may be sent: no error has retired the session and
        the server has not closed it."""
        return not self._broken and self._client.state is ClientState.READY

    @property
    def extensions(self) -> Mapping[str, str]:
        """The server's EHLO extensions (upper-case keyword -> parameters); empty after HELO."""
        return self._client.extensions

    # -- opening -----------------------------------------------------------------------

    async def _open(
        self, helo_name: str, tls: ssl.SSLContext | None, check: ChainCheck | None
    ) -> None:
        with self._conversation("greeting"):
            greeting = await self._read()
            if not greeting.is_success:
                raise _refusal(greeting, f"{self._host} refused the connection")
            await self._hello(helo_name)
            if tls is None or "STARTTLS" not in self._client.extensions:
                return
            await self._write(self._client.starttls())
            if not (await self._read()).is_success:
                return  # opportunistic: go on in plaintext
        try:
            with self._conversation("TLS handshake with"):
                # The MX name, not the address: a certificate names the host (RFC 8461 4.2).
                tls_stream = trio.SSLStream(self._stream, tls, server_hostname=self._mx_host)
                self._stream = tls_stream
                with trio.fail_after(self._timeout):
                    await tls_stream.do_handshake()
                self._tls_active = True
                suite = tls_stream.cipher()
                # A handshake that passed under CERT_REQUIRED is one whose chain verified.
                verified = tls.verify_mode == ssl.CERT_REQUIRED
                if check is not None:
                    problem = check(_presented_chain(tls_stream))
                    if problem is not None:
                        raise TlsFailure(None, f"DANE check of {self._mx_host} failed: {problem}")
                    verified = True
                self._tls = (tls_stream.version(), None if suite is None else suite[0], verified)
            with self._conversation("greeting over TLS"):
                await self._hello(helo_name)
        except TransientFailure as exc:
            raise TlsFailure(exc.reply, str(exc)) from exc.__cause__

    async def _hello(self, helo_name: str) -> None:
        await self._write(self._client.ehlo(helo_name))
        reply = await self._read()
        if reply.is_permanent:  # an old server that does not know EHLO
            await self._write(self._client.helo(helo_name))
            reply = await self._read()
        if not reply.is_success:
            raise _refusal(reply, f"{self._host} refused our greeting")

    # -- sending -----------------------------------------------------------------------

    async def send(
        self,
        mail_from: str,
        recipients: list[str],
        message: bytes,
        before_message: Callable[[], Awaitable[None]] | None = None,
        *,
        requiretls: bool = False,
    ) -> TransferResult:
        """Send ``message`` from ``mail_from`` ("" for a bounce) to ``recipients``.

        One transaction: MAIL, one RCPT per distinct recipient, DATA and the message when
        at least one recipient was accepted (RSET otherwise). With PIPELINING, MAIL, the
        RCPTs and DATA go out in one write. Refusals are results, not errors; a recipient
        with a non-ASCII local part is refused locally (`S553_NEEDS_SMTPUTF8`) when the
        server lacks SMTPUTF8, and so is a message whose header has UTF-8
        (`S554_MESSAGE_NEEDS_SMTPUTF8`: never sent raw; send its `downgrade` instead).
        SMTPUTF8 is asked for when an address or the header needs it. `before_message`, when
        given, is awaited after the server's 354 and before the message: a sender records
        its last transaction's outcome there, so at most one is delivered unrecorded. The
        session may send again afterwards. ``requiretls`` (RFC 8689) sends only over TLS whose
        certificate was verified (DANE or MTA-STS) to a server offering REQUIRETLS, passed on
        in MAIL; otherwise nothing is sent and every recipient gets `S550_REQUIRETLS_NEEDED`.

        Raises ValueError for an address that cannot be sent (see `check_path`) or no
        recipients, and `TransientFailure` when the connection fails, the server answers
        421, or an earlier error or cancellation left the session unusable; the outcome of
        every recipient is then unknown and the session must be closed.
        """
        if not recipients:
            raise ValueError("a message needs at least one recipient")
        check_path(mail_from, allow_null=True)
        unique = list(dict.fromkeys(check_path(address) for address in recipients))
        if requiretls and not (self._tls[2] and "REQUIRETLS" in self._client.extensions):
            return TransferResult(S550_REQUIRETLS_NEEDED, {}, None)
        utf8_offered = "SMTPUTF8" in self._client.extensions
        if not (mail_from.isascii() or utf8_offered):
            return TransferResult(S553_NEEDS_SMTPUTF8, {}, None)
        if not utf8_offered and has_utf8_header(to_crlf(message)):
            return TransferResult(S554_MESSAGE_NEEDS_SMTPUTF8, {}, None)
        refused = {a: S553_NEEDS_SMTPUTF8 for a in unique if not (a.isascii() or utf8_offered)}
        to_send = [address for address in unique if address not in refused]
        if not to_send:
            return TransferResult(S553_NEEDS_SMTPUTF8, refused, None)
        with self._conversation("sending to"):
            mail_reply, replies, data_reply = await self._transaction(
                mail_from, to_send, message, before_message, requiretls
            )
        answered = refused | replies
        return TransferResult(
            mail_reply, {a: answered[a] for a in unique if a in answered}, data_reply
        )

    async def probe(self, mail_from: str, recipient: str) -> SmtpReply:
        """Whether the server would take mail for ``recipient``: MAIL, RCPT, then RSET.

        Never DATA: nothing is delivered. Returns the RCPT reply (the MAIL reply when MAIL is
        refused; `S553_NEEDS_SMTPUTF8`, made up, for a non-ASCII address the server cannot
        take). Raises like `send`.
        """
        check_path(mail_from, allow_null=True)
        address = check_path(recipient)
        client = self._client
        utf8 = not (mail_from.isascii() and address.isascii())
        if utf8 and "SMTPUTF8" not in client.extensions:
            return S553_NEEDS_SMTPUTF8
        with self._conversation("probing"):
            await self._write(client.mail_from(mail_from, smtputf8=utf8))
            reply = await self._read()
            if reply.is_success:
                await self._write(client.rcpt_to(address))
                reply = await self._read()
            await self._write(client.rset())
            self._broken = not (await self._read()).is_success
        return reply

    async def _transaction(
        self,
        mail_from: str,
        recipients: list[str],
        message: bytes,
        before_message: Callable[[], Awaitable[None]] | None,
        requiretls: bool,
    ) -> tuple[SmtpReply, dict[str, SmtpReply], SmtpReply | None]:
        client = self._client
        body = to_crlf(message)
        utf8 = not (mail_from.isascii() and all(a.isascii() for a in recipients))
        utf8 = utf8 or has_utf8_header(body)
        mail = client.mail_from(
            mail_from, len(body), eight_bit=not body.isascii(), smtputf8=utf8, requiretls=requiretls
        )
        replies: dict[str, SmtpReply] = {}
        data_answer: SmtpReply | None = None
        if self._pipelining and "PIPELINING" in client.extensions:
            await self._write(mail + b"".join(map(client.rcpt_to, recipients)) + client.data())
            mail_reply = await self._read()
            for address in recipients:
                replies[address] = await self._read()
            data_answer = await self._read()
        else:
            await self._write(mail)
            mail_reply = await self._read()
            if mail_reply.is_success:
                for address in recipients:
                    await self._write(client.rcpt_to(address))
                    replies[address] = await self._read()
            if any(reply.is_success for reply in replies.values()):
                await self._write(client.data())
                data_answer = await self._read()
        if not mail_reply.is_success:
            replies = {}  # their 503s only echo the refused MAIL
        accepted = any(reply.is_success for reply in replies.values())
        data_reply = data_answer if accepted else None
        if client.state is ClientState.MESSAGE:
            if accepted and before_message is not None:
                await before_message()
            # A server that says 354 with no recipient accepted gets an empty message.
            content, end = client.message_parts(body if accepted else b"")
            if len(content) < _SEND_SIZE:  # one write; a large message is not copied
                await self._write(content + end, self._data_timeout)
            else:
                await self._write(content, self._data_timeout)
                await self._write(end, self._data_timeout)
            final_reply = await self._read(self._data_timeout)
            data_reply = final_reply if accepted else None
        if client.state is not ClientState.READY:
            await self._write(client.rset())
            self._broken = not (await self._read()).is_success
        return mail_reply, replies, data_reply

    # -- closing -----------------------------------------------------------------------

    async def quit(self) -> None:
        """Say QUIT, wait for the goodbye, and close. A server that hangs up or stays silent
        at this point is not an error: whatever was sent has been answered already.
        """
        try:
            if not self._broken and self._client.state is not ClientState.CLOSED:
                with contextlib.suppress(TransientFailure), self._conversation("leaving"):
                    await self._write(self._client.quit())
                    await self._read()
        finally:
            await self.aclose()

    async def aclose(self) -> None:
        """Close the connection at once, without QUIT."""
        self._broken = True
        with trio.move_on_after(self._timeout), contextlib.suppress(trio.BrokenResourceError):
            await self._stream.aclose()

    # -- the edge ----------------------------------------------------------------------

    @contextlib.contextmanager
    def _conversation(self, what: str) -> Iterator[None]:
        """Translate errors into `TransientFailure` and retire the session after any error."""
        if self._broken:
            raise TransientFailure(None, f"the connection to {self._host} is no longer usable")
        try:
            with _translated(f"{what} {self._host}"):
                yield
        except BaseException:
            self._broken = True
            raise

    async def _write(self, data: bytes, timeout: float | None = None) -> None:  # noqa: ASYNC109
        with trio.fail_after(timeout or self._timeout):
            if len(data) <= _SEND_SIZE:
                await self._stream.send_all(data)
                return
            # In pieces: a TLS stream encrypts all it is given into one more buffer, and then
            # copies that out, so a 34 MiB message sent whole was held three times (issue 28).
            view = memoryview(data)
            for start in range(0, len(view), _SEND_SIZE):
                await self._stream.send_all(view[start : start + _SEND_SIZE])

    async def _read(self, timeout: float | None = None) -> SmtpReply:  # noqa: ASYNC109
        reply = self._client.next_reply()
        if not isinstance(reply, SmtpReply):
            # Only a reply still to come needs a deadline: pipelined replies mostly arrive
            # together, and a cancel scope (~10 us) per reply was a visible share of the
            # transaction.
            with trio.fail_after(timeout or self._timeout):
                while not isinstance(reply, SmtpReply):
                    self._client.receive_data(await self._stream.receive_some(_RECEIVE_SIZE))
                    reply = self._client.next_reply()
        if reply.code == 421:
            raise TransientFailure(reply, f"{self._host} is closing the connection: {reply}")
        return reply
