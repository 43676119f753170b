"""A tiny authoritative DNS server on 127.0.0.1 (UDP and TCP, same port) for tests.

Tests script the records they need; the service under test resolves against
``server.nameserver``. Semantics are deliberately literal so tests read plainly:

* a name that was never ``set`` answers NXDOMAIN (parents of set names are *not*
  implicitly created; ``set(name, "MX", [])`` makes a name exist with no records);
* a known name queried for another type answers NOERROR with an empty answer;
* a name passed to ``fail`` answers SERVFAIL, to exercise temporary DNS errors;
* a name passed to ``secure`` is answered with the AD bit set (as a validating resolver
  marks authenticated data, RFC 4035 3.2.3) when the query asked for DNSSEC (DO or AD);
  TLSA records are set as zone text: ``set("_25._tcp.mx.example", "TLSA", ["3 1 1 ab.."])``.

UDP answers larger than 512 bytes (or the client's EDNS payload size) are truncated
with the TC flag, so real clients retry over TCP, as they must for long DKIM keys.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from dataclasses import dataclass
from typing import Literal

import dns.exception
import dns.flags
import dns.message
import dns.name
import dns.rcode
import dns.rdataclass
import dns.rdatatype
import dns.rdtypes.ANY.TXT
import dns.rrset
import trio

from tests.harness.peer import HOST, LoopbackPeer

_UDP_DEFAULT_PAYLOAD = 512  # RFC 1035 limit for clients that do not speak EDNS
_TXT_CHUNK = 255  # a TXT character-string holds at most 255 bytes
_TCP_BIND_ATTEMPTS = 20

Transport = Literal["udp", "tcp"]


@dataclass(frozen=True)
class DnsQuery:
    """One question the server answered, so tests can see e.g. the TCP fallback."""

    name: str  # lowercase, without the trailing dot
    rdtype: str  # "MX", "TXT", ...
    transport: Transport


def _to_name(name: str) -> dns.name.Name:
    # dns.name.Name compares and hashes case-insensitively, so it is the zone key.
    return dns.name.from_text(name.rstrip(".") + ".")


def _txt_rdata(text: str) -> dns.rdtypes.ANY.TXT.TXT:
    # Built from bytes, not zone text, so no quoting or escaping can go wrong; long
    # values are split into 255-byte character-strings the way DKIM keys are published.
    raw = text.encode()
    chunks = [raw[i : i + _TXT_CHUNK] for i in range(0, len(raw), _TXT_CHUNK)] or [b""]
    return dns.rdtypes.ANY.TXT.TXT(dns.rdataclass.IN, dns.rdatatype.TXT, chunks)


def _make_rrset(name: str, rdtype: str, values: list[str], ttl: int) -> dns.rrset.RRset:
    if dns.rdatatype.from_text(rdtype) == dns.rdatatype.TXT:
        rdatas = [_txt_rdata(value) for value in values]
        rrset = dns.rrset.RRset(_to_name(name), dns.rdataclass.IN, dns.rdatatype.TXT)
        for rdata in rdatas:
            rrset.add(rdata, ttl)
        return rrset
    # Origin root: "10 mx.example.com" means the same as "10 mx.example.com." to a test.
    return dns.rrset.from_text_list(
        _to_name(name), ttl, "IN", rdtype, values, origin=dns.name.root, relativize=False
    )


class DnsServer(LoopbackPeer):
    """Scriptable authoritative server; start it with ``await nursery.start(server.run)``."""

    def __init__(self) -> None:
        self._zone: dict[dns.name.Name, dict[dns.rdatatype.RdataType, dns.rrset.RRset]] = {}
        self._failing: set[dns.name.Name] = set()
        self._secure: set[dns.name.Name] = set()
        self.queries: list[DnsQuery] = []

    # -- scripting -------------------------------------------------------------------

    def set(self, name: str, rdtype: str, values: list[str], ttl: int = 60) -> None:
        """Replace the ``rdtype`` records of ``name``; an empty list means NOERROR/no data.

        Values are zone-file text ("10 mx.example.com." for MX, "127.0.0.1" for A),
        except TXT values, which are the plain text of one record each.
        """
        rrset = _make_rrset(name, rdtype, values, ttl)
        self._zone.setdefault(rrset.name, {})[rrset.rdtype] = rrset

    def remove(self, name: str, rdtype: str | None = None) -> None:
        """Forget one type of ``name``, or (no type) the whole name and its failure."""
        key = _to_name(name)
        if rdtype is None:
            self._zone.pop(key, None)
            self._failing.discard(key)
            self._secure.discard(key)
        elif key in self._zone:
            self._zone[key].pop(dns.rdatatype.from_text(rdtype), None)

    def fail(self, name: str) -> None:
        """Make every query for ``name`` answer SERVFAIL until ``remove(name)``/``clear()``."""
        self._failing.add(_to_name(name))

    def secure(self, *names: str) -> None:
        """Answer queries for these names as authenticated (AD) from now on."""
        self._secure.update(_to_name(name) for name in names)

    def clear(self) -> None:
        self._zone.clear()
        self._failing.clear()
        self._secure.clear()

    # -- addressing ------------------------------------------------------------------

    @property
    def nameserver(self) -> str:
        return f"{HOST}:{self.port}"

    # -- answering -------------------------------------------------------------------

    def _answer(self, query: dns.message.Message, transport: Transport) -> dns.message.Message:
        response = dns.message.make_response(query)
        response.flags |= dns.flags.AA
        if len(query.question) != 1:
            response.set_rcode(dns.rcode.FORMERR)
            return response
        question = query.question[0]
        self.queries.append(
            DnsQuery(
                name=question.name.to_text(omit_final_dot=True).lower(),
                rdtype=dns.rdatatype.to_text(question.rdtype),
                transport=transport,
            )
        )
        asked = bool(query.flags & dns.flags.AD) or bool(query.ednsflags & dns.flags.DO)
        if question.name in self._secure and asked and question.name not in self._failing:
            response.flags |= dns.flags.AD
        if question.name in self._failing:
            response.set_rcode(dns.rcode.SERVFAIL)
        elif question.name not in self._zone:
            response.set_rcode(dns.rcode.NXDOMAIN)
        else:
            rrset = self._zone[question.name].get(question.rdtype)
            if rrset:  # an empty rrset means "exists, no data": NOERROR with no answer
                response.answer.append(rrset)
        return response

    def _respond(self, wire: bytes, transport: Transport) -> bytes | None:
        try:
            query = dns.message.from_wire(wire)
            response = self._answer(query, transport)
        except dns.exception.DNSException:
            return None  # garbage in: stay silent, as a real server would
        if transport == "tcp":
            return response.to_wire(max_size=65535)  # 0 would mean "the client's EDNS size"
        limit = max(query.payload, _UDP_DEFAULT_PAYLOAD) if query.edns >= 0 else 512
        # prefer_truncation drops whole RRsets that do not fit and sets TC.
        return response.to_wire(max_size=limit, prefer_truncation=True)

    async def _serve_udp(self, sock: trio.socket.SocketType) -> None:
        while True:
            wire, address = await sock.recvfrom(65535)
            reply = self._respond(wire, "udp")
            if reply is not None:
                await sock.sendto(reply, address)

    async def _serve_tcp_connection(self, stream: trio.SocketStream) -> None:
        # RFC 7766: each message is prefixed by its two-byte length; a client may send many.
        buffer = bytearray()
        with contextlib.suppress(trio.BrokenResourceError):
            while chunk := await stream.receive_some(65535):
                buffer += chunk
                while len(buffer) >= 2 + (size := int.from_bytes(buffer[:2], "big")):
                    wire = bytes(buffer[2 : 2 + size])
                    del buffer[: 2 + size]
                    reply = self._respond(wire, "tcp")
                    if reply is None:
                        return
                    await stream.send_all(len(reply).to_bytes(2, "big") + reply)

    # -- lifecycle -------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        """Serve until cancelled; ``nursery.start`` returns the port once both sockets bind."""
        udp, tcp = await _bind_udp_and_tcp()
        self._port = udp.getsockname()[1]
        with udp, tcp:  # the listener closes tcp too; closing twice is harmless
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._serve_udp, udp)
                await nursery.start(
                    trio.serve_listeners, self._serve_tcp_connection, [trio.SocketListener(tcp)]
                )
                task_status.started(self.port)


async def _bind_udp_and_tcp() -> tuple[trio.socket.SocketType, trio.socket.SocketType]:
    """Bind UDP on a kernel-chosen port, then TCP on the same number (retry if it is taken)."""
    for _ in range(_TCP_BIND_ATTEMPTS):
        udp = trio.socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        tcp = trio.socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            await udp.bind((HOST, 0))
            tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            await tcp.bind((HOST, udp.getsockname()[1]))
            tcp.listen()
        except BaseException as exc:  # including Cancelled: never leak a socket
            udp.close()
            tcp.close()
            if isinstance(exc, OSError) and exc.errno == errno.EADDRINUSE:
                continue
            raise
        return udp, tcp
    raise RuntimeError("could not bind UDP and TCP on the same port")
