"""Where one SMTP session keeps the message it is receiving: on disk past `SPOOL_AT`.

The server machine hands its data over (`SmtpServer.take_message_data`) whenever it holds
`SPOOL_AT` octets, so a session holds at most that much of a message in memory however large
it is, and a stranger's 40 MiB messages wait on disk, not in memory, until the session may
take them whole (engine/platform/message_memory.py). Postfix writes every message to its queue file as
it arrives; here only the ones past `SPOOL_AT` (most mail is smaller) go to a temporary file,
unlinked at once, so nothing is left behind by a crash. Each write and the final read is one
thread hop; the file is read back into one bytes object, the message's only whole copy.
"""

from __future__ import annotations

import tempfile
from typing import BinaryIO

import trio

SPOOL_AT = 256 * 1024  # octets a session holds in memory before it writes them out


def _new_file() -> BinaryIO:
    # Unbuffered (a FileIO): the final read is one allocation of the file's size.
    file: BinaryIO = tempfile.TemporaryFile(buffering=0)  # noqa: SIM115 - the Spool closes it
    return file


def _write_all(file: BinaryIO, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[file.write(view) :]


class Spool:
    """One message's data on disk (`size` octets so far); `discard` when done."""

    def __init__(self) -> None:
        self._file: BinaryIO | None = None
        self.size = 0

    async def write(self, data: bytes) -> None:
        """Add `data` at the end."""
        if not data:
            return
        if self._file is None:
            self._file = await trio.to_thread.run_sync(_new_file)
        await trio.to_thread.run_sync(_write_all, self._file, data)
        self.size += len(data)

    async def read_with(self, tail: bytes) -> bytes:
        """The whole message: what was written, then `tail` (never spooled); the spool is
        emptied."""
        if self._file is None:
            return tail
        await self.write(tail)
        file = self._file
        self._file, self.size = None, 0

        def read() -> bytes:
            with file:
                file.seek(0)
                return file.read()

        return await trio.to_thread.run_sync(read)

    def discard(self) -> None:
        """Forget what was written (the file goes with it)."""
        if self._file is not None:
            self._file.close()
        self._file, self.size = None, 0
