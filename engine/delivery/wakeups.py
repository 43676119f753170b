"""How accepting code tells the delivery router that a domain has new work.

Waking never blocks the caller and never loses work: the database holds every recipient,
so if the channel is ever full the router is told to rescan the database instead.
"""

from __future__ import annotations

from collections.abc import Iterable

import trio

CAPACITY = 10_000


class Wakeups:
    def __init__(self) -> None:
        self._send, self.receive = trio.open_memory_channel[str](CAPACITY)
        self.overflowed = False

    def wake(self, domains: Iterable[str]) -> None:
        """Note that these recipient domains have new work (callable from any Trio task)."""
        for domain in domains:
            try:
                self._send.send_nowait(domain)
            except trio.WouldBlock:
                self.overflowed = True
            except trio.ClosedResourceError:
                return  # shutting down: the next start rescans the database
