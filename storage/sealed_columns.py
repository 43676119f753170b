"""Secrets found at start: whether a database holds any sealed value (so a missing master
key must not be replaced by a new one), and sealing those still stored in clear (a database
written before sealing existed). Apart from storage/sealing.py, which seals one value and
knows no transaction.
"""

from __future__ import annotations

from storage.sealing import PREFIX, SEALED_COLUMNS
from storage.tx import Tx


def anything_sealed(tx: Tx) -> bool:
    """Whether the database already holds a sealed secret, under whatever master key."""
    return any(
        tx.value(
            f"SELECT 1 FROM {c.table} WHERE {c.column} LIKE :sealed LIMIT 1",
            {"sealed": PREFIX + "%"},
        )
        is not None
        for c in SEALED_COLUMNS
    )


def seal_clear_values(tx: Tx) -> int:
    """Seal every secret still stored in clear (written before sealing existed); how many.

    Sealed values are left alone, so this can run at every start; each update is
    conditional on the clear value, so nodes starting at once never seal a value twice.
    """
    sealed = 0
    for c in SEALED_COLUMNS:
        rows = tx.all(
            f"SELECT {c.row_key} AS row_key, {c.column} AS value FROM {c.table}"
            f" WHERE {c.column} NOT LIKE :sealed",
            {"sealed": PREFIX + "%"},
        )
        for row in rows:
            sealed += tx.execute(
                f"UPDATE {c.table} SET {c.column} = :value"
                f" WHERE {c.row_key} = :row AND {c.column} = :clear",
                {
                    "value": tx.sealer.seal(c, row["row_key"], row["value"]),
                    "row": row["row_key"],
                    "clear": row["value"],
                },
            )
    return sealed
