# Copyright: gpufleet developers
# SPDX-License-Identifier: GPL-3.0-or-later
"""One reconciler per inventory: an advisory lock on a file in its state directory.

The lock is an flock(2) on `lock`, so it goes away with the process that held it,
however that process ended; the file holds the holder's PID for the error message.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path
from types import TracebackType


class LockHeld(Exception):
    """Another reconciler works on this inventory."""


class InventoryLock:
    def __init__(self, directory: Path) -> None:
        self.path = directory / "lock"
        self._fd: int | None = None

    def acquire(self) -> InventoryLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise LockHeld(
                f"another reconciler (pid {holder}) is working on this inventory "
                f"(lock {self.path}); wait for it or stop it"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> InventoryLock:
        return self.acquire()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()
