"""Cached MTA-STS policies of recipient domains, shared by every node (engine/delivery/mta_sts.py
decides when to fetch one again). Keyed by the recipient domain, lower-case; not tenant data,
so not scoped by workspace: a domain publishes one policy for every sender."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from storage.codec import from_json, parse_timestamp, timestamp, to_json
from storage.tx import Tx


@dataclass(frozen=True, slots=True)
class Cached:
    policy_id: str
    mode: str
    mx: tuple[str, ...]
    max_age: int
    expires_at: datetime


def get(tx: Tx, domain: str) -> Cached | None:
    row = tx.one(
        "SELECT policy_id, mode, mx, max_age, expires_at FROM mta_sts_policies WHERE domain = :d",
        {"d": domain},
    )
    if row is None:
        return None
    return Cached(
        row["policy_id"],
        row["mode"],
        tuple(from_json(row["mx"])),
        int(row["max_age"]),
        parse_timestamp(row["expires_at"]),
    )


def put(tx: Tx, domain: str, cached: Cached, fetched_at: datetime) -> None:
    params = {
        "d": domain,
        "id": cached.policy_id,
        "mode": cached.mode,
        "mx": to_json(list(cached.mx)),
        "age": cached.max_age,
        "at": timestamp(fetched_at),
        "until": timestamp(cached.expires_at),
    }
    tx.execute(
        "INSERT INTO mta_sts_policies"
        " (domain, policy_id, mode, mx, max_age, fetched_at, expires_at)"
        " VALUES (:d, :id, :mode, :mx, :age, :at, :until) ON CONFLICT (domain) DO UPDATE SET"
        " policy_id = :id, mode = :mode, mx = :mx, max_age = :age, fetched_at = :at,"
        " expires_at = :until",
        params,
    )
