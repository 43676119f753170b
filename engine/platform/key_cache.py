"""Recently authenticated API keys, so a request need not read the database to know its key.

An entry is trusted for `KEY_CACHE_SECONDS`. Deleting a key or changing a plan evicts at once
on this node; another node sharing the database notices within that time.
"""

from __future__ import annotations

from dataclasses import dataclass

import trio

from storage.api_keys import KeyHolder

KEY_CACHE_SECONDS = 10.0
KEY_CACHE_SIZE = 10_000


@dataclass(slots=True)
class _Cached:
    holder: KeyHolder
    fetched_at: float


class KeyCache:
    """Recently seen keys by hash, each trusted for KEY_CACHE_SECONDS."""

    def __init__(self) -> None:
        self._entries: dict[str, _Cached] = {}

    def get(self, key_hash: str) -> KeyHolder | None:
        entry = self._entries.get(key_hash)
        if entry is None or trio.current_time() - entry.fetched_at > KEY_CACHE_SECONDS:
            return None
        return entry.holder

    def put(self, holder: KeyHolder) -> None:
        if len(self._entries) >= KEY_CACHE_SIZE:
            self._entries.clear()
        self._entries[holder.key_hash] = _Cached(holder, trio.current_time())

    def evict(self, key_id: str) -> None:
        for key_hash, entry in list(self._entries.items()):
            if entry.holder.key_id == key_id:
                del self._entries[key_hash]

    def clear(self) -> None:
        self._entries.clear()
