"""The process's budget of message bytes: granted in arrival order, never leaked."""

from __future__ import annotations

import trio
import trio.testing

from engine.platform.message_memory import MessageMemory


async def test_a_large_message_is_not_starved_by_small_ones_behind_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    memory = MessageMemory(limit=100)
    await memory.acquire(60)
    order: list[str] = []

    async def take(name: str, amount: int) -> None:
        async with memory.holding(amount):
            order.append(name)
            await trio.sleep(1)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(take, "large", 100)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(take, "small", 10)  # it would fit now, but comes after
        await trio.testing.wait_all_tasks_blocked()
        assert order == [] and memory.statistics().waiting == 2
        memory.release(60)
    assert order == ["large", "small"]
    assert memory.statistics().held == 0


async def test_a_wait_cancelled_leaks_nothing(autojump_clock: trio.testing.MockClock) -> None:
    memory = MessageMemory(limit=100)
    await memory.acquire(100)
    with trio.move_on_after(5):
        await memory.acquire(50)
    assert memory.statistics() == memory.statistics().__class__(100, 100, 0)
    memory.release(100)
    async with memory.holding(memory.cost(10**9)):  # more than the budget: it runs alone
        assert memory.statistics().held == 100
    assert memory.statistics().held == 0
