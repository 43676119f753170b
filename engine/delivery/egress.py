"""Egress: what a ready queue hands a round's prepared transfers to, and how an egress
reports back.

Delivery runs as scheduled side -> ready side -> egress (docs/architecture.md): the scheduled
side of a destination's queue claims due recipients and builds their messages into
`Transfer`s; its ready side holds the destination's connection slots and hands the transfers
to an egress, which reports each recipient's typed outcome (engine/delivery/classify.py) to
the round's `Record`; the record alone turns outcomes into statuses, events and incidents
(engine/delivery/outcomes.py) and writes them.

Two egresses exist: the SMTP egress (engine/delivery/smtp_egress.py: MX hosts, TLS, connections
kept from round to round) and the sandbox's (engine/sandbox/capture.py), which answers the
mail of sandboxed workspaces instead of the network. Which one takes a transfer is chosen by
the router's `Routes` from what the composition root (postroom/service.py) gave it, not by
the queue.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Protocol

from engine.delivery.classify import Outcome, Verdict
from engine.delivery.messages import WireMessage
from storage.emails import Email, Recipient


@dataclass(frozen=True, slots=True)
class Source:
    """What outgoing connections are opened as: the name they greet with (EHLO) and the
    local address they are bound to (None: the one the system picks). An egress source of
    the operator's (engine/delivery/egress_sources.py) is one; the default is the host's."""

    ehlo_name: str
    bind_address: str | None = None


@dataclass(frozen=True, slots=True)
class Transfer:
    """One email to its recipients at one destination: one SMTP transaction."""

    email: Email
    recipients: list[Recipient]
    message: WireMessage
    # The egress source it leaves from, chosen by its pool when claimed (None: the default).
    source: Source | None = None


@dataclass(frozen=True, slots=True)
class Lanes:
    """How an egress may spread a round: over `connections` parallel connections, each
    carrying at most `per_connection` transfers (None: no limit)."""

    connections: int
    per_connection: int | None = None


class Record(Protocol):
    """A round's record of outcomes, as an egress reports to it."""

    def settle(self, email: Email, recipient: Recipient, outcome: Outcome) -> Verdict:
        """One recipient's outcome as of now, written with the round's next write; its
        verdict."""
        ...

    def transaction(self, transfer: Transfer, outcomes: Sequence[Outcome]) -> int:
        """An SMTP transaction ended with these outcomes (one per recipient, in order):
        recorded as of now and written at once, while its connection goes on. Returns the
        mark `recorded` waits for before this connection's next message is sent."""
        ...

    async def recorded(self, upto: int) -> None:
        """Wait until a write has ended for the outcomes up to `upto`."""
        ...

    async def may_start(self) -> bool:
        """Whether another SMTP transaction may start: the node still holds the round's
        leases, the queue is not stopping and the database can record what is sent."""
        ...

    def stopping(self) -> bool:
        """Whether the queue is stopping (a drain or an outage): transfers no connection
        started are left as they are, not an attempt."""
        ...


class Egress(Protocol):
    """Sends transfers, reporting every recipient's outcome to the round's record."""

    async def send(self, transfers: list[Transfer], record: Record, lanes: Lanes) -> None: ...


class Selective(Egress, Protocol):
    """An egress that takes only some transfers (the sandbox: those of sandboxed workspaces)."""

    async def select(self, transfers: list[Transfer]) -> list[Transfer]:
        """Those of `transfers` this egress takes."""
        ...

    async def takes(self, email_ids: Collection[str]) -> set[str]:
        """Those of these emails whose transfers it takes, decided before any is loaded."""
        ...


class Routes:
    """Chooses the egress of each transfer: the first selective egress that takes it, else
    the destination's own (the SMTP egress)."""

    def __init__(self, selective: Sequence[Selective] = ()) -> None:
        self._selective = tuple(selective)

    async def route(
        self, transfers: list[Transfer], default: Egress
    ) -> list[tuple[Egress, list[Transfer]]]:
        """`transfers` split into batches, each with the egress that sends it."""
        batches: list[tuple[Egress, list[Transfer]]] = []
        rest = transfers
        for egress in self._selective:
            if not rest:
                break
            taken = await egress.select(rest)
            if taken:
                batches.append((egress, taken))
                chosen = {id(t) for t in taken}
                rest = [t for t in rest if id(t) not in chosen]
        if rest:
            batches.append((default, rest))
        return batches

    async def all_elsewhere(self, email_ids: Collection[str]) -> bool:
        """Whether selective egresses take every one of these emails: their transfers need
        no network, so their destination's MX need not be looked up."""
        rest = set(email_ids)
        for egress in self._selective:
            if not rest:
                break
            rest -= await egress.takes(rest)
        return not rest
