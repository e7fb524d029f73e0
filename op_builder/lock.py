"""An inter-process lock on a file, for "N ranks import the same op: one compiles".

flock() locks belong to the open file description, so the kernel drops them when
the holder dies, however it dies: a lock left by a killed process is never waited
on. The holder's pid is written into the file only to say who we are waiting for.
"""
from __future__ import annotations

import fcntl
import os
import sys
import time
from pathlib import Path

_REPORT_AFTER_S = 5.0


class FileLock:
    def __init__(self, path: Path, purpose: str):
        self.path, self.purpose = path, purpose
        self._fd: int | None = None

    def __enter__(self) -> "FileLock":
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        start, reported = time.monotonic(), False
        while True:
            try:
                fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if not reported and time.monotonic() - start > _REPORT_AFTER_S:
                    print(f"apex: waiting for process {self._holder()} ({self.purpose})", file=sys.stderr, flush=True)
                    reported = True
                time.sleep(0.1)
        os.ftruncate(self._fd, 0)
        os.write(self._fd, str(os.getpid()).encode())
        return self

    def __exit__(self, *exc) -> None:
        assert self._fd is not None
        fcntl.flock(self._fd, fcntl.LOCK_UN)
        os.close(self._fd)
        self._fd = None

    def _holder(self) -> str:
        try:
            return self.path.read_text().strip() or "?"
        except OSError:
            return "?"
