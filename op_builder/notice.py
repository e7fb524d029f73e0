"""How the builder talks to the user: one line at a time, on stderr unless told otherwise.

Builds are announced ("compiling op X", minutes) and cache hits are silent. A test runner that
captures stderr (pytest) hides the announcement for the whole build, so it may install its own
writer (tests/conftest.py shows it live). A pip install captures its build's output unless run
with -v, so what an install must say goes to the terminal itself (``to_terminal``).
"""
from __future__ import annotations

import sys
from typing import Callable, Optional

_writer: Optional[Callable[[str], None]] = None


def say(line: str) -> None:
    """Tell the user ``line`` (one line, no trailing newline)."""
    if _writer is not None:
        _writer(line)
    else:
        print(line, file=sys.stderr, flush=True)


def set_writer(writer: Optional[Callable[[str], None]]) -> None:
    """Send every notice to ``writer`` instead of stderr (``None``: back to stderr)."""
    global _writer
    _writer = writer


def to_terminal(line: str) -> None:
    """Tell the user ``line`` even where stderr is captured (pip without -v): on the controlling
    terminal when stderr is not one, else on stderr. Each line appears once either way."""
    if not sys.stderr.isatty():
        try:
            with open("/dev/tty", "w") as terminal:
                terminal.write(line + "\n")
            return
        except OSError:  # no controlling terminal (CI): stderr, seen with pip -v
            pass
    print(line, file=sys.stderr, flush=True)
