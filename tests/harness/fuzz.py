"""Hypothesis against the service under test, inside the normal suite.

Hypothesis runs a test's examples synchronously, while the service answers in the test's own
Trio run. `run_examples` therefore runs the examples in a worker thread, from where each
example calls the service back in Trio with `trio.from_thread.run`. Every fuzzer of the suite
is bounded the same way: a fixed number of examples, derandomized (the same examples on every
run and machine), no example database and no deadline. What every fuzzer asserts of every
answer, and of the service after the run, is here too.

Schemathesis (installed for tests/test_schemathesis.py, and loaded by pytest as a plugin)
swaps Hypothesis' example printer for a silent one, so a failing example is not printed: put
what was sent in the assertion message.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import httpx
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.harness.service import Service

T = TypeVar("T")

# Counters with a sample only for an actor that had one: any sample at all is a fault.
FAULT_METRICS = ("postroom_work_faults_total{", "postroom_actor_restarts_total{")


def bounded(max_examples: int) -> settings:
    """The settings of a fuzz run in the suite: reproducible and of a known size."""
    return settings(
        max_examples=max_examples,
        deadline=None,
        derandomize=True,
        database=None,
        # Each example is a round trip to the service, not a pure function call.
        suppress_health_check=[HealthCheck.too_slow],
    )


async def run_examples(
    strategy: st.SearchStrategy[T], check: Callable[[T], None], *, max_examples: int
) -> None:
    """Call `check` on `max_examples` examples of `strategy` in a worker thread, from where it
    reaches the service with `trio.from_thread.run`. A failing example fails the test."""

    @bounded(max_examples)
    @given(strategy)
    def examples(example: T) -> None:
        check(example)

    await trio.to_thread.run_sync(examples)


def assert_answered_cleanly(response: httpx.Response, sent: object) -> None:
    """2xx, or a 4xx with the standard error body; never a 5xx."""
    assert response.status_code < 500, (sent, response.status_code, response.text)
    if response.status_code >= 400:
        body = response.json()
        assert isinstance(body.get("code"), str) and body["code"], (sent, body)
        assert isinstance(body.get("detail"), str) and body["detail"], (sent, body)


async def assert_alive_without_faults(service: Service) -> None:
    """The service answers, and no work item made an actor raise, nor did an actor restart."""
    public = service.client()
    assert (await public.get("/healthz")).status_code == 200
    metrics = (await public.get("/metrics")).text
    assert [line for line in metrics.splitlines() if line.startswith(FAULT_METRICS)] == []
