"""Shared pytest configuration: the protocol peers and the service under test, and the order
the tests run in (the longest first, so the run does not end waiting on one of them)."""

from __future__ import annotations

from typing import Any

import pytest
from xdist.scheduler import LoadScheduling

# The MCP SDK, which a service under test loads on a worker thread (mcp_door/http.py), imported
# here on the main thread: it imports anyio, a pytest plugin's package that pytest rewrites
# with `ast.parse` on first import, and CPython 3.11's AST constructor is not thread-safe (two
# parses at once fail with "SystemError: AST constructor recursion depth mismatch": a fuzz test
# on a fresh checkout met it).
import mcp_door.server  # noqa: F401

pytest_plugins = ["tests.harness.fixtures", "tests.harness.service", "tests.harness.browser"]

# The tests that take longest, longest first (from `--durations` of a full run; a test id
# prefix takes every parametrisation). They start first, each on the next free worker, so that
# no worker is still on one of them when the others have run out of tests: in file order the
# six test_workers cases (half a minute each) came last. Update it from a run's durations.
LONGEST_FIRST = (
    "tests/test_mx_memory.py::test_eight_parallel_34_mib_messages_to_the_mx_stay_within_memory",
    "tests/test_database_outage.py::test_database_crashes_under_load_lose_nothing",
    "tests/test_build.py::test_built_file_serves_with_only_python",
    "tests/test_cluster.py::test_a_node_stalled_past_its_death",
    "tests/test_cluster.py::test_killed_nodes_lose_nothing",
    "tests/test_durability.py::test_kill_during_delivery_loses_nothing",
    "tests/test_workers.py::test_workers_share_the_ports_deliver_once_and_stop_together",
    "tests/test_workers.py::test_a_killed_worker_is_started_again",
    "tests/test_container.py::test_compose_file_runs_two_postroom_nodes_on_postgresql",
    "tests/test_container.py::test_image_sends_keeps_its_data_across_a_restart",
    "tests/test_schemathesis.py::test_no_operation_of_the_openapi_document_answers",
    "tests/test_console_compliance.py::",
    "tests/test_cluster.py::test_a_clean_stop_under_load_sends_nothing_twice",
    "tests/test_database_outage.py::test_two_outages_in_a_row",
    "tests/test_upgrade.py::test_mail_queued_by_an_earlier_release",
)


def _rank(nodeid: str) -> int:
    return next(
        (i for i, prefix in enumerate(LONGEST_FIRST) if nodeid.startswith(prefix)),
        len(LONGEST_FIRST),
    )


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=lambda item: _rank(item.nodeid))  # stable: the rest keep their order


class LongestFirst(LoadScheduling):  # type: ignore[misc]  # xdist has no type hints
    """xdist's `load` distribution, except that the longest tests (first in the collection)
    go one at a time to whichever worker is free: in its runs of consecutive tests one worker
    would get them all. The rest go in runs as before, which keeps a module's tests together
    on few workers (its module-scoped fixtures, such as a server process, start once each)."""

    @property
    def maxschedchunk(self) -> int | None:
        """The most tests sent to a worker at a time (LoadScheduling reads it each time)."""
        if self.collection is None or not self.pending:
            return self._chunk
        if _rank(self.collection[self.pending[0]]) < len(LONGEST_FIRST):
            return 1
        return self._chunk or len(self.collection)  # None: as many as the heuristic says

    @maxschedchunk.setter
    def maxschedchunk(self, chunk: int | None) -> None:
        self._chunk = chunk


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    if config.getoption("dist") != "load" or config.getoption("maxschedchunk") is not None:
        return None  # a distribution asked for by name is left as it is
    return LongestFirst(config, log)
