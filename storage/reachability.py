"""Whether the database answers, as this process last found out: storage's fail-fast switch.

Work that fails as an outage (storage/errors.py `is_outage`, a full disk aside: that database
answers) makes the database suspect. One probe, off the callers' path (a fresh connection and
a `SELECT 1` with short time-outs, the engine's `probe`), tells a dropped connection from a
database that is gone. Gone: every read and write fails at once with `DatabaseUnreachable`
instead of queueing behind the driver's pool time-out, and the same probe, every
`PROBE_EVERY`, finds out when it answers again; the engine then has fresh connections and work
goes on. No caller retries on its own: one probe, not every request, asks.

One owner: the Trio task `run`, started with the database; threads only run the probe. Times
are Trio's (`trio.current_time`), so tests move them with a MockClock.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import trio

from storage.errors import DatabaseUnreachable, StorageFull, is_outage

PROBE_EVERY = 0.5  # seconds between probes while the database is gone
PROBE_TIMEOUT = 5.0  # seconds a probe may take before it counts as no answer

log = logging.getLogger("postroom.storage")


class Reachability:
    """The switch: `check` before work, `failed` after an error, `run` as the prober."""

    def __init__(self, probe: Callable[[bool], None]) -> None:
        # Sync, run in a thread: returns when the database answers, having renewed the
        # engine's connections when told (it was gone).
        self._probe = probe
        self._suspect = trio.Event()
        self._back = trio.Event()
        self.down_since: float | None = None  # Trio time the probe found it gone; None: up
        self._scope = trio.CancelScope()

    def check(self) -> None:
        """Raise `DatabaseUnreachable` at once while the database is known to be gone."""
        if self.down_since is not None:
            raise DatabaseUnreachable(trio.current_time() - self.down_since)

    def failed(self, exc: BaseException) -> None:
        """Note a unit of work's error: an outage makes the prober look."""
        if is_outage(exc) and not isinstance(exc, StorageFull | DatabaseUnreachable):
            self._suspect.set()

    def down_for(self) -> float | None:
        """Seconds since the probe found the database gone; None while it answers."""
        if self.down_since is None:
            return None
        return trio.current_time() - self.down_since

    async def until_back(self) -> None:
        """Return once the database answers (at once when it is not known to be gone)."""
        if self.down_since is not None:
            await self._back.wait()

    def stop(self) -> None:
        """End `run` (the database is closing)."""
        self._scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        with self._scope:
            task_status.started()
            await self._probe_when_suspect()

    async def _probe_when_suspect(self) -> None:
        while True:
            await self._suspect.wait()
            if not await self._answers(renew=False):
                self.down_since = trio.current_time()
                log.error("the database does not answer: refusing work at once until it does")
                while True:  # polled: nothing tells a process that a server came back
                    await trio.sleep(PROBE_EVERY)
                    if await self._answers(renew=True):
                        break
                log.warning(
                    "the database answers again after %.1f s", trio.current_time() - self.down_since
                )
                self.down_since = None
                self._back.set()
                self._back = trio.Event()
            # What failed meanwhile was of the same outage, or of the connections just renewed.
            self._suspect = trio.Event()

    async def _answers(self, renew: bool) -> bool:
        with trio.move_on_after(PROBE_TIMEOUT):
            try:
                # Abandoned on time-out: a probe stuck in a connect must not hold the switch.
                await trio.to_thread.run_sync(self._probe, renew, abandon_on_cancel=True)
                return True
            except Exception as exc:
                if not is_outage(exc):
                    # A fault of the probe itself says nothing of the database: never let it
                    # hold all work back.
                    log.exception("the database probe failed; taking the database as up")
                    return True
        return False
