"""Eight strangers sending 34 MiB each to a forward at once cannot fill the service's memory.

`postroom serve` as shipped (its workers included), a forward to a mailbox on the sink, eight
34 MiB messages to the inbound MX in parallel: every one is accepted and forwarded, the
resident memory of all the service's processes rises by less than 200 MiB, and comes back
to within 50 MiB of where it was. The figures are bench/mx_memory.py's (per process there).
"""

from __future__ import annotations

from bench.mx_memory import measure

RISE_MIB = 200
LEFT_MIB = 50


async def test_eight_parallel_34_mib_messages_to_the_mx_stay_within_memory() -> None:
    # On SQLite only, to keep the suite short (a run takes 40-60 s); bench/mx_memory.py
    # measures both engines (PostgreSQL there: +153 MiB at the peak, +11 MiB after).
    figures = await measure("sqlite", messages=8, mib=34, settle=2.0)
    assert figures["replies"] == ["250"] * 8
    assert figures["delivered"] == 8
    rise = figures["peak_mib"] - figures["before_mib"]
    left = figures["after_mib"] - figures["before_mib"]
    assert rise < RISE_MIB, figures
    assert left < LEFT_MIB, figures
