"""Values as the database holds them: ids, timestamps and JSON.

Timestamps are stored as fixed-width UTC text (`2026-11-22T02:14:47.123456Z`), so they sort
and compare as strings identically on SQLite and PostgreSQL.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from collections.abc import Iterable
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any

_LOW_62 = (1 << 62) - 1


def new_random_id() -> str:
    """A new UUID string, version 4: 122 random bits and no time. For a workspace, whose id's
    first 8 characters name its SMTP credentials (spec: the relay username)."""
    return str(uuid.uuid4())


def new_id() -> str:
    """A new UUID string, version 7 (RFC 9562): the Unix time in milliseconds, then 74 random
    bits. Ids that grow with time put new rows at the end of every index on them, instead of
    on a random page of each: a commit of a batch writes a few pages, not one per row."""
    random = int.from_bytes(os.urandom(10)) >> 6  # 74 bits
    value = (
        (time.time_ns() // 1_000_000) << 80
        | 0x7 << 76  # version
        | (random >> 62) << 64  # 12 random bits
        | 0b10 << 62  # variant
        | random & _LOW_62
    )
    text = f"{value:032x}"
    return f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"


@lru_cache(maxsize=256)
def timestamp(value: datetime) -> str:
    """The stored form of an aware datetime: `2026-11-24T04:00:00.000000Z`."""
    # Cached: the rows of one commit share its time (an email, its recipients and events;
    # a batch of them), and formatting was a tenth of the writer's time on a batch.
    # isoformat, not strftime, which is slower and pads years before 1000 differently.
    return value.astimezone(UTC).isoformat(timespec="microseconds")[:-6] + "Z"


def parse_timestamp(value: str) -> datetime:
    """The datetime of a stored timestamp."""
    # fromisoformat reads the stored form (Z included) some 60 times faster than strptime,
    # which was most of the database time of reading an email.
    return datetime.fromisoformat(value)


def parse_optional_timestamp(value: str | None) -> datetime | None:
    """The datetime of a nullable stored timestamp (None stays None)."""
    return None if value is None else parse_timestamp(value)


# One encoder for every call: json.dumps with options builds a new one each time, which is
# half the cost of encoding the small values stored per email in bulk sends.
_JSON = json.JSONEncoder(separators=(",", ":"), sort_keys=True)


def to_json(value: Any) -> str:
    """Compact JSON text for a JSON column."""
    if not value and isinstance(value, list | dict):  # most cc, bcc, headers and tags
        return "[]" if isinstance(value, list) else "{}"
    return _JSON.encode(value)


def from_json(value: str | None) -> Any:
    """The value of a JSON column (None stays None)."""
    return None if value is None else json.loads(value)


def contains(text: str) -> str:
    """A LIKE pattern (used with `ESCAPE '!'`) matching `text` as a plain substring.

    `%` and `_` in the text are literal, not wildcards.
    """
    literal = text.replace("!", "!!").replace("%", "!%").replace("_", "!_")
    return f"%{literal}%"


def in_list(prefix: str, values: Iterable[Any]) -> tuple[str, dict[str, Any]]:
    """`:p0, :p1, ...` for an `IN (...)` of `values`, and its parameters (named `prefix` and a
    number, so that several lists can share a statement)."""
    names = {f"{prefix}{i}": value for i, value in enumerate(values)}
    return ", ".join(f":{name}" for name in names), names
