"""A connection's client by name, for the `Received:` field of the mail it sends: its
forward-confirmed reverse DNS name, looked up once per connection and only once it sends a
message (most connections of a busy listener never do), never holding a message's 250
for longer than `TIMEOUT` (the field then names the address alone)."""

from __future__ import annotations

import trio

from engine.platform import dns
from engine.platform.runtime import Runtime

TIMEOUT = 2.0


class ClientName:
    def __init__(self, rt: Runtime, address: str) -> None:
        self._rt = rt
        self.address = address
        self._looked_up = False
        self._name: str | None = None

    async def get(self) -> str | None:
        """The confirmed name, or None."""
        if not self._looked_up:
            self._looked_up = True
            with trio.move_on_after(TIMEOUT):
                self._name = await dns.confirmed_name(self._rt.resolver, self.address)
        return self._name
