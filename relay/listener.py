"""A TCP listener speaking SMTP: accepts connections up to a limit, drives each one.

Shared by the submission relay and the inbound MX, which differ only in their policy
(`ServerPolicy`) and their per-connection `SessionHandler`. Rules: at most
`max_connections` conversations at once, and at most `max_per_client` from one client (an
IPv4 address, or an IPv6 /64: one subscriber's block, `login_limits.client_group`); the last
`RESERVED` places go only to clients holding none yet, so a few hosts holding most of the
places cannot lock everyone else out (one more is told 421 and closed, before any other
work). Past half full the listener is under stress and idle sessions get a shorter time
(relay/connection.py). `stop()` stops accepting and makes idle conversations say 421 at once,
while a conversation in the middle of a message finishes it first (bounded by `GRACE`).
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import trio

from engine.accounts.login_limits import client_group
from engine.platform.message_memory import MessageMemory
from engine.smtp.replies import SmtpReply
from engine.smtp.server import ServerPolicy, SmtpServer
from relay.connection import SessionHandler, ShutdownSignal, Timeouts, drive

log = logging.getLogger("postroom.relay")

GRACE = 10.0  # seconds a conversation in the middle of a message gets to finish on stop
MAX_CONNECTIONS = 500  # conversations at once on one listener
MAX_PER_CLIENT = 20  # of those, from one client address (or IPv6 /64)
# Of MAX_CONNECTIONS, the places kept for clients with no connection open: 25 hosts holding
# their 20 each leave these 100 to everyone else (docs/decisions.md).
RESERVED = 100
S421_TOO_BUSY = SmtpReply.of(421, "4.7.0 Too many connections, try again later")
S421_TOO_MANY_FROM_CLIENT = SmtpReply.of(
    421, "4.7.0 Too many connections from your address, try again later"
)

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class ListenerStatistics:
    """A snapshot for /metrics."""

    name: str
    connections_open: int
    connections_total: int
    connections_refused: int  # the listener was full
    connections_refused_per_client: int  # that client had its share open (or the reserve)
    messages_accepted: int
    messages_refused: int


async def shared_port_socket(host: str, port: int) -> trio.socket.SocketType:
    """A listening socket that other processes may bind to the same port (SO_REUSEPORT)."""
    family = trio.socket.AF_INET6 if ":" in host else trio.socket.AF_INET
    sock = trio.socket.socket(family, trio.socket.SOCK_STREAM)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEADDR, 1)
    sock.setsockopt(trio.socket.SOL_SOCKET, trio.socket.SO_REUSEPORT, 1)
    await sock.bind((host, port))
    sock.listen(trio.socket.SOMAXCONN)
    return sock


class SmtpListener:
    """One SMTP port. `run` binds and serves until `stop()` or cancellation."""

    def __init__(
        self,
        name: str,
        address: Address,
        policy: ServerPolicy,
        handler_factory: Callable[[str], SessionHandler],
        *,
        tls: ssl.SSLContext | None,
        max_connections: int = MAX_CONNECTIONS,
        max_per_client: int = MAX_PER_CLIENT,
        reserved: int = RESERVED,
        timeouts: Timeouts | None = None,
        memory: MessageMemory | None = None,
    ) -> None:
        """`handler_factory` makes the `SessionHandler` of one connection from its client's
        address; `memory` is the process's budget of message bytes, shared by its listeners."""
        self.name = name
        self._address = address
        self._policy = policy
        self._handler_factory = handler_factory
        self._tls = tls
        self._max_connections = max_connections
        self._max_per_client = max_per_client
        self._reserved = min(reserved, max_connections - 1)
        self._timeouts = timeouts or Timeouts()
        self._memory = memory or MessageMemory()
        self._shutdown = ShutdownSignal()
        self._stopped = trio.Event()
        self._open = 0
        self._open_by_client: dict[str, int] = {}  # only client groups with a connection open
        self._total = 0
        self._refused_connections = 0
        self._refused_per_client = 0
        # Set before `run` when several worker processes serve this port (SO_REUSEPORT): the
        # kernel spreads the connections between them.
        self.reuse_port = False
        self._accepted = 0
        self._refused = 0

    def message_done(self, accepted: bool) -> None:
        if accepted:
            self._accepted += 1
        else:
            self._refused += 1

    def stop(self) -> None:
        """Stop accepting; idle conversations end with 421, busy ones finish first."""
        self._stopped.set()

    async def run(
        self, *, task_status: trio.TaskStatus[Address] = trio.TASK_STATUS_IGNORED
    ) -> None:
        host, port = self._address
        if self.reuse_port:
            listeners = [trio.SocketListener(await shared_port_socket(host, port))]
        else:
            listeners = await trio.open_tcp_listeners(port, host=host)
        bound = listeners[0].socket.getsockname()
        log.info("%s listening on %s:%s", self.name, bound[0], bound[1])
        async with trio.open_nursery() as conversations:
            async with trio.open_nursery() as accepting:
                accepting.start_soon(
                    partial(
                        trio.serve_listeners, self._handle, listeners, handler_nursery=conversations
                    )
                )
                task_status.started((bound[0], bound[1]))
                await self._stopped.wait()
                accepting.cancel_scope.cancel()
            for listener in listeners:
                await listener.aclose()
            self._shutdown.close()
            conversations.cancel_scope.deadline = trio.current_time() + GRACE

    def under_stress(self) -> bool:
        """Whether more than half the places are taken (idle sessions get less time)."""
        return self._open * 2 > self._max_connections

    def _refusal(self, group: str) -> SmtpReply | None:
        """Why a new connection from client `group` is turned away at once, or None."""
        if self._open >= self._max_connections:
            self._refused_connections += 1
            return S421_TOO_BUSY
        held = self._open_by_client.get(group, 0)
        reserve = self._open >= self._max_connections - self._reserved
        if held >= self._max_per_client or (reserve and held > 0):
            self._refused_per_client += 1
            return S421_TOO_MANY_FROM_CLIENT
        return None

    async def _handle(self, stream: trio.SocketStream) -> None:
        self._total += 1
        try:
            client = str(stream.socket.getpeername()[0])
            group = client_group(client)
            refusal = self._refusal(group)
            if refusal is not None:
                with trio.move_on_after(5):
                    await stream.send_all(refusal.to_bytes())
                return
            self._open += 1
            self._open_by_client[group] = self._open_by_client.get(group, 0) + 1
            try:
                server = SmtpServer(self._policy)
                await drive(
                    stream,
                    server,
                    self._handler_factory(client),
                    tls=self._tls,
                    timeouts=self._timeouts,
                    shutdown=self._shutdown,
                    tally=self,
                    stressed=self.under_stress,
                    memory=self._memory,
                )
            finally:
                self._open -= 1
                left = self._open_by_client.pop(group) - 1
                if left:
                    self._open_by_client[group] = left
        except (trio.BrokenResourceError, trio.ClosedResourceError, trio.TooSlowError, OSError):
            pass  # the client went away or stalled the TLS handshake: nothing to tell it
        finally:
            await trio.aclose_forcefully(stream)

    def statistics(self) -> ListenerStatistics:
        return ListenerStatistics(
            self.name,
            self._open,
            self._total,
            self._refused_connections,
            self._refused_per_client,
            self._accepted,
            self._refused,
        )
