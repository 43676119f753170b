"""A node's trust in its leases (engine/platform/tenure.py), in virtual time: what a delivery
connection is told before each SMTP transaction, around a stall."""

from __future__ import annotations

import trio
import trio.testing

from engine.platform.nodes import DEAD_AFTER, TRUST
from engine.platform.tenure import Tenure


async def _beat_when_wanted(tenure: Tenure, alive: bool) -> None:
    """A node keeper's beat, made the moment a task asks for one."""
    await tenure.wanted()
    tenure.beaten(trio.current_time(), alive, TRUST)


async def test_the_trust_ends_before_other_nodes_may_declare_the_node_dead() -> None:
    assert DEAD_AFTER.total_seconds() > TRUST


async def test_without_a_keeper_the_leases_are_trusted() -> None:
    tenure = Tenure()
    assert tenure.held(0)
    assert await tenure.hold(0)


async def test_a_fresh_beat_is_trusted_without_asking(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tenure = Tenure()
    tenure.beaten(trio.current_time(), True, TRUST)
    await trio.sleep(TRUST - 1)
    assert tenure.held(0)
    with trio.fail_after(0.001):  # no beat is asked for
        assert await tenure.hold(0)


async def test_after_a_stall_a_beat_that_finds_the_node_alive_lets_it_go_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tenure = Tenure()
    tenure.beaten(trio.current_time(), True, TRUST)
    await trio.sleep(DEAD_AFTER.total_seconds() + 5)  # stopped: no beat meanwhile
    assert not tenure.held(0)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_beat_when_wanted, tenure, True)
        assert await tenure.hold(0)
    assert tenure.epoch == 0 and tenure.statistics().confirmations == 1


async def test_after_a_stall_a_node_declared_dead_drops_what_it_claimed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    tenure = Tenure()
    tenure.beaten(trio.current_time(), True, TRUST)
    claimed_in = tenure.epoch
    await trio.sleep(DEAD_AFTER.total_seconds() + 5)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(_beat_when_wanted, tenure, False)
        assert not await tenure.hold(claimed_in)  # freed: never sent, never recorded
    # What it claims from now on is its own again.
    assert tenure.epoch == claimed_in + 1
    assert await tenure.hold(tenure.epoch)
    assert not tenure.held(claimed_in)
