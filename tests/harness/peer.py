"""What the loopback test peers share: their address, and recording what arrives."""

from __future__ import annotations

from typing import Generic, TypeVar

import trio

HOST = "127.0.0.1"

T = TypeVar("T")


class LoopbackPeer:
    """A server on 127.0.0.1 whose port is known once `run` has bound it."""

    _port: int | None = None

    @property
    def host(self) -> str:
        return HOST

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError(f"{type(self).__name__} is not running yet")
        return self._port


class Arrivals(Generic[T]):
    """Items a peer received, in order, and a way to wait until enough have come."""

    def __init__(self) -> None:
        self.items: list[T] = []
        self._arrived = trio.Event()

    def add(self, item: T) -> None:
        self.items.append(item)
        self._arrived.set()
        self._arrived = trio.Event()

    async def wait_for(self, n: int, timeout: float) -> list[T]:  # noqa: ASYNC109 - tests pass a deadline
        """Wait until at least `n` items arrived; all of them so far."""
        with trio.fail_after(timeout):
            while len(self.items) < n:
                await self._arrived.wait()
        return list(self.items)
