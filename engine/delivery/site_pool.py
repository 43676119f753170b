"""Idle SMTP connections, pooled per egress source and MX host, for every destination behind it.

KumoMTA's ready queue is per egress source and MX site: a connection is to a host, not to a
recipient domain, so the mail of two domains one provider hosts (every Google Workspace domain
behind aspmx.l.google.com) goes over the same connections. A destination's SMTP egress keeps
its connections while its queue has a next round ready (engine/delivery/smtp_egress.py);
when the ready queue gives them back (`SmtpEgress.close`, after the round's outcomes are
written, so no other round sends on one before its last transaction is recorded), they come
here, and the next round of any destination whose MX hosts include the host takes one before
opening a new connection. One left unused for `KEEP_IDLE` is closed with QUIT, as Postfix's
connection cache does (`smtp_connection_cache_time_limit`, 2 s): long enough for the next
round of a busy site, short enough not to hold the receiver's connection slots for nothing.

A connection is handed only to mail that would have opened it the same way: the same source
(bind address and EHLO name) and the same TLS posture (`Posture`: the policy applied and
whether the certificate was verified), so MTA-STS or DANE mail never inherits a connection
opened opportunistically, nor mail of one source another's.

The pool is shared by the queues of one router; it is changed only by synchronous calls (no
checkpoint between looking and taking), and only its own task (`run`) closes what expired.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import trio

from engine.delivery.egress import Source
from engine.smtp.session import SmtpSession

KEEP_IDLE = 2.0  # seconds an idle connection waits for another round
QUIT_WAIT = 5.0  # seconds a server gets to answer QUIT


@dataclass(frozen=True, slots=True)
class Posture:
    """How a connection's TLS was settled: the policy applied (opportunistic, mta-sts, dane)
    and whether the server's certificate was verified."""

    policy: str
    verified: bool


@dataclass(slots=True)
class _Idle:
    session: SmtpSession
    uses: int  # transactions it has carried (for a per-connection limit)
    expires: float  # trio.current_time() after which it is closed


@dataclass
class SitePool:
    """The idle connections of every destination of one router."""

    _idle: dict[tuple[Source, str, Posture], list[_Idle]] = field(default_factory=dict)
    _changed: trio.Event = field(default_factory=trio.Event)

    def put(self, source: Source, session: SmtpSession, uses: int) -> None:
        """Keep a usable session for `KEEP_IDLE` seconds, for any round going to its host."""
        peer = session.peer
        key = (source, peer.mx_host, Posture(peer.policy, peer.tls_verified))
        expires = trio.current_time() + KEEP_IDLE
        self._idle.setdefault(key, []).append(_Idle(session, uses, expires))
        self._changed.set()

    def take(
        self, source: Source, wanted: Iterable[tuple[str, Posture]]
    ) -> tuple[SmtpSession, int] | None:
        """An idle session from `source` to the first of the (host, posture) pairs that has
        one, the most recently used first (the least likely to have been dropped), with the
        transactions it has carried; None when there is none."""
        for host, posture in wanted:
            idle = self._idle.get((source, host, posture))
            if idle:
                kept = idle.pop()
                return kept.session, kept.uses
        return None

    def __len__(self) -> int:
        return sum(len(each) for each in self._idle.values())

    async def run(self) -> None:
        """Close idle sessions with QUIT once they expire; runs until cancelled."""
        async with trio.open_nursery() as quitting:
            while True:
                now = trio.current_time()
                for key in list(self._idle):
                    expired = [i for i in self._idle[key] if i.expires <= now]
                    if expired:
                        self._idle[key] = [i for i in self._idle[key] if i.expires > now]
                        for idle in expired:
                            quitting.start_soon(quit_session, idle.session)
                    if not self._idle[key]:
                        del self._idle[key]
                self._changed = trio.Event()
                soonest = min(
                    (i.expires for each in self._idle.values() for i in each), default=None
                )
                with trio.move_on_at(
                    soonest if soonest is not None else trio.current_time() + 3600
                ):
                    await self._changed.wait()

    async def close(self) -> None:
        """Say QUIT on every idle session (at once, each waiting at most QUIT_WAIT)."""
        sessions = self._empty()
        async with trio.open_nursery() as quitting:
            for session in sessions:
                quitting.start_soon(quit_session, session)

    async def abandon(self) -> None:
        """Stopping: close every idle session without waiting on QUIT (at most a second)."""
        sessions = self._empty()
        with trio.CancelScope(shield=True), trio.move_on_after(1):
            for session in sessions:
                await session.aclose()

    def _empty(self) -> list[SmtpSession]:
        sessions = [i.session for each in self._idle.values() for i in each]
        self._idle.clear()
        return sessions


async def quit_session(session: SmtpSession) -> None:
    """End a session with QUIT (then close), waiting at most QUIT_WAIT for the server."""
    with trio.move_on_after(QUIT_WAIT):
        await session.quit()
    await session.aclose()
