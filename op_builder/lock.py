"""Inter-process locks on files: "N ranks import the same op: one compiles", and "is the process
that owns this scratch directory still alive?".

flock() locks belong to the open file description, so the kernel drops them when the holder dies,
however it dies (a zombie not yet reaped included): a lock left by a killed process is never
waited on, and holding one is a reliable sign of life. The holder's pid is written into the file
only to say whom we are waiting for.
"""
from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from typing import Optional

from . import notice

_REPORT_AFTER_S = 5.0
_POLL_S = 0.1
MARKER = "apex lock, pid "  # first bytes of every lock file: `make clean` recognises apex's own


class FileLock:
    """An exclusive lock on ``path``, which exists only while the lock is held (no lock files pile up).

    Removing a lock file is safe with this protocol: after locking, a taker checks that the path
    still names the file it locked; if the previous holder removed it meanwhile, it starts over."""

    def __init__(self, path: Path, purpose: str):
        self.path, self.purpose = path, purpose
        self._fd: Optional[int] = None

    def __enter__(self) -> "FileLock":
        start, reported = time.monotonic(), False
        while True:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
            while not _try_flock(fd):
                if not reported and time.monotonic() - start > _REPORT_AFTER_S:
                    notice.say(f"apex: waiting for process {self._holder()} ({self.purpose})")
                    reported = True
                time.sleep(_POLL_S)
            if _names_file(self.path, fd):
                break
            os.close(fd)  # locked a file its holder had already removed: take the current one
        os.ftruncate(fd, 0)
        os.write(fd, f"{MARKER}{os.getpid()}".encode())
        self._fd = fd
        return self

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        self.path.unlink(missing_ok=True)  # while still locked: nobody can hold the removed file
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def _holder(self) -> str:
        try:
            return self.path.read_text().replace(MARKER, "").strip() or "?"
        except OSError:
            return "?"


def claim(fd: int) -> None:
    """Lock the fresh file open at ``fd`` for as long as it stays open (a sign of life), and mark it apex's."""
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.write(fd, f"{MARKER}{os.getpid()}".encode())


def abandoned(path: Path) -> Optional[int]:
    """If nobody holds ``path``'s lock (its holder died), lock it and return the descriptor; else None."""
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    if _try_flock(fd):
        return fd
    os.close(fd)
    return None


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


def _names_file(path: Path, fd: int) -> bool:
    try:
        on_disk = os.stat(path)
    except FileNotFoundError:
        return False
    held = os.fstat(fd)
    return (on_disk.st_dev, on_disk.st_ino) == (held.st_dev, held.st_ino)
