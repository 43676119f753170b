"""Mailbox-full counts per address (the `soft_bounces` table); the engine decides what counts
(engine/delivery/bounces.py `tally`), this module only keeps the numbers.

Rows are keyed by `storage.privacy.address_hash` (workspace and address), never the address.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

from storage.codec import in_list, parse_timestamp, timestamp
from storage.privacy import address_hash
from storage.tx import Tx

Counts = tuple[int, datetime, datetime]  # count, first_at, last_at


def read(tx: Tx, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Counts]:
    """The counts of these (workspace id, address) keys that have any."""
    hashed = {address_hash(tx, ws, address): (ws, address) for ws, address in keys}
    if not hashed:
        return {}
    names, params = in_list("h", hashed)
    rows = tx.all(
        "SELECT address_hash, count, first_at, last_at FROM soft_bounces"
        f" WHERE address_hash IN ({names})",
        params,
    )
    return {
        hashed[row["address_hash"]]: (
            int(row["count"]),
            parse_timestamp(row["first_at"]),
            parse_timestamp(row["last_at"]),
        )
        for row in rows
    }


def write(tx: Tx, counts: dict[tuple[str, str], Counts]) -> None:
    """Store these counts, replacing any kept for the same keys."""
    tx.execute_many(
        "INSERT INTO soft_bounces (address_hash, workspace_id, count, first_at, last_at)"
        " VALUES (:h, :ws, :count, :first, :last) ON CONFLICT (address_hash) DO UPDATE SET"
        " count = excluded.count, first_at = excluded.first_at, last_at = excluded.last_at",
        [
            {
                "h": address_hash(tx, ws, address),
                "ws": ws,
                "count": count,
                "first": timestamp(first),
                "last": timestamp(last),
            }
            for (ws, address), (count, first, last) in counts.items()
        ],
    )


def clear(tx: Tx, keys: Iterable[tuple[str, str]]) -> None:
    """Forget the counts of these (workspace id, address) keys: mail reached them."""
    hashes = list(dict.fromkeys(address_hash(tx, ws, address) for ws, address in keys))
    if hashes:
        names, params = in_list("h", hashes)
        tx.run(f"DELETE FROM soft_bounces WHERE address_hash IN ({names})", params)
