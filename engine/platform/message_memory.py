"""How many bytes of message data one process holds in memory at once, all work together.

A stranger on the inbound MX can send 500 connections of 40 MiB each; nothing may hold them
all. Message data is spooled to disk while it arrives (relay/spool.py) and whoever needs a
whole message in memory (the SMTP session storing it, the forwarder sending it on) first
takes its `cost` from this budget and gives it back when done; work over the budget waits,
in arrival order, so a large message is never starved by a stream of small ones. The cost of
a message is its size times `COPIES` (the message and one working copy: storing it, or
building what is sent on), never more than the whole budget: a message larger than the
budget runs alone.

Rules: one budget per process (`Runtime.message_memory`); every `acquire` is paired with a
`release` of the same amount (`holding` does both); waiting may be cancelled at any point
without leaking a grant.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import trio

# 64 MiB: a 34 MiB message (with its working copy) fits alone, ~300 ordinary 100 KiB
# messages fit together; Postfix holds none of a message in memory, Exim a 8 KiB buffer.
LIMIT = 64 * 1024 * 1024
COPIES = 2
LARGE_GRANT = 8 * 1024 * 1024  # a grant this large makes the budget's next idle moment call on_idle


@dataclass(frozen=True, slots=True)
class MemoryStatistics:
    """A snapshot for /metrics."""

    limit: int
    held: int
    waiting: int


class MessageMemory:
    """A budget of bytes, granted first come, first served."""

    def __init__(self, limit: int = LIMIT) -> None:
        self._limit = limit
        self._held = 0
        self._waiting: deque[tuple[int, trio.Event]] = deque()
        self._large_since_idle = False
        # Called when the budget falls idle after a large grant: the composition root gives
        # the process's freed memory back to the system there (postroom/startup.py).
        self.on_idle: Callable[[], None] | None = None

    def cost(self, size: int) -> int:
        """What working on a message of `size` bytes takes from the budget."""
        return max(1, min(size * COPIES, self._limit))

    async def acquire(self, amount: int) -> None:
        """Take `amount` (at most the limit) from the budget, waiting for it in turn."""
        amount = min(amount, self._limit)
        self._large_since_idle = self._large_since_idle or amount >= LARGE_GRANT
        if not self._waiting and self._held + amount <= self._limit:
            self._held += amount
            await trio.lowlevel.checkpoint()
            return
        turn = (amount, trio.Event())
        self._waiting.append(turn)
        try:
            await turn[1].wait()
        except BaseException:
            if turn[1].is_set():  # granted as it was cancelled: give it back
                self.release(amount)
            else:
                self._waiting.remove(turn)
                self._grant()
            raise

    def release(self, amount: int) -> None:
        """Give back what an `acquire` of `amount` took."""
        self._held -= min(amount, self._limit)
        self._grant()
        if not self._held and self._large_since_idle:
            self._large_since_idle = False
            if self.on_idle is not None:
                self.on_idle()

    @asynccontextmanager
    async def holding(self, amount: int) -> AsyncIterator[None]:
        """`acquire(amount)` for the body of the `async with`, then `release`."""
        await self.acquire(amount)
        try:
            yield
        finally:
            self.release(amount)

    def _grant(self) -> None:
        while self._waiting and self._held + self._waiting[0][0] <= self._limit:
            amount, granted = self._waiting.popleft()
            self._held += amount
            granted.set()

    def statistics(self) -> MemoryStatistics:
        return MemoryStatistics(self._limit, self._held, len(self._waiting))
