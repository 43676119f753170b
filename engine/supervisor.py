"""The engine supervisor: starts every long-lived actor in one nursery.

Each actor is started with `nursery.start`, so the supervisor reports ready only when every
actor is; an actor that crashes takes the service down with it instead of failing silently.
`statistics()` gathers each actor's frozen snapshot for `/metrics` and `/healthz`.
"""

from __future__ import annotations

from typing import Any, Protocol

import trio


class Actor(Protocol):
    name: str

    async def run(self, *, task_status: trio.TaskStatus[None] = ...) -> None: ...

    def statistics(self) -> Any: ...


class Supervisor:
    def __init__(self, actors: list[Actor]) -> None:
        self._actors = actors
        self._running = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            for actor in self._actors:
                await nursery.start(actor.run)
            self._running = True
            task_status.started()
        self._running = False

    @property
    def running(self) -> bool:
        return self._running

    def statistics(self) -> dict[str, Any]:
        """Each actor's latest snapshot, by actor name."""
        return {actor.name: actor.statistics() for actor in self._actors}
