"""Password hashing: argon2id on threads of its own.

Argon2id takes 64 MiB and about 0.15 s of two cores per call, so it runs on threads of its
own (`PasswordHashing`), never on the ones storage uses: a flood of logins waits there, in a
short queue beyond which it is refused at once, while database work goes on undelayed.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

import trio
from argon2 import PasswordHasher
from argon2.exceptions import InvalidHashError, VerificationError

from engine.platform.errors import RateLimited

# One argon2id call already keeps two cores busy (its four lanes run on threads of their
# own), so more hashing threads than half the cores would only take CPU from the API.
PASSWORD_THREADS = max(1, (os.cpu_count() or 1) // 2)
# Callers that may wait for a hashing thread: about 2.5 s of work on a 2-core machine.
PASSWORD_QUEUE = 16

_hasher = PasswordHasher()
# Verified against when the user does not exist, so both paths cost the same time: the hash,
# with the hasher's parameters, of a random password that was thrown away (a literal, so
# starting a process does not pay for one argon2 call).
_DUMMY_HASH = "$argon2id$v=19$m=65536,t=3,p=4$+bkGw2W0dFTUI2RKIKBIeg$Zn3aV8wZFnBNO4SU76eEc1Kk0W9b7mRsB1JNQyU/uHM"


def _verify(password_hash: str | None, password: str) -> bool:
    try:
        return _hasher.verify(password_hash or _DUMMY_HASH, password) and password_hash is not None
    except (VerificationError, InvalidHashError):
        return False


class PasswordHashing:
    """Argon2id on a small thread limiter of its own, with a bounded queue in front of it."""

    def __init__(self, threads: int = PASSWORD_THREADS, queue: int = PASSWORD_QUEUE) -> None:
        self._threads = trio.CapacityLimiter(threads)
        self._capacity = threads + queue
        self._holders = 0

    @contextmanager
    def place(self) -> Iterator[None]:
        """Hold one of the places among callers allowed to hash; RateLimited when all are taken.

        A login takes its place before anything else, so a flood beyond the queue is
        answered at once and costs neither memory held in waiting nor a database write.
        """
        if self._holders >= self._capacity:
            raise RateLimited(
                "too many passwords are being checked; retry in a second", retry_after=1
            )
        self._holders += 1
        try:
            yield
        finally:
            self._holders -= 1

    async def hash(self, password: str) -> str:
        """The argon2id hash of a password."""
        return await trio.to_thread.run_sync(_hasher.hash, password, limiter=self._threads)

    async def verify(self, password_hash: str | None, password: str) -> bool:
        """Whether `password` matches; a None hash (unknown user) costs the same and fails."""
        return await trio.to_thread.run_sync(
            _verify, password_hash, password, limiter=self._threads
        )
