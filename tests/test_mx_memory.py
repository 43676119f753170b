"""Eight strangers sending 34 MiB each to a forward at once cannot fill the service's memory.

`postroom serve` as shipped (its workers included), a forward to a mailbox on the sink, eight
34 MiB messages to the inbound MX in parallel: every one is accepted and forwarded, the
resident memory of all the service's processes rises by less than 200 MiB, and comes back
to within 50 MiB of where it was. The figures are bench/mx_memory.py's.
"""

from __future__ import annotations

import os

import pytest

from bench.mx_memory import measure

RISE_MIB = 200
LEFT_MIB = 50


@pytest.mark.skip(
    reason="issue 28 target not met yet (2026-11-26, load ~19 on 2 cores): SQLite +182 MiB peak"
    " but +93 MiB after; PostgreSQL +292 MiB peak, +116 MiB after; and a run takes ~5 min,"
    " not the 40 s a suite test may (see bench/mx_memory.py)"
)
async def test_eight_parallel_34_mib_messages_to_the_mx_stay_within_memory() -> None:
    engine = "postgresql" if os.environ.get("POSTROOM_TEST_POSTGRES") else "sqlite"
    figures = await measure(engine, messages=8, mib=34, settle=5.0)
    assert figures["replies"] == ["250"] * 8
    assert figures["delivered"] == 8
    rise = figures["peak_mib"] - figures["before_mib"]
    left = figures["after_mib"] - figures["before_mib"]
    assert rise < RISE_MIB, figures
    assert left < LEFT_MIB, figures
