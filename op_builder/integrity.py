"""Is a built library still the file that was built? Checked before every load.

A truncated library kills the process that maps it (SIGBUS, exit 135), one of random bytes fails
to load with an error that names no cause. So the size and SHA-256 of each library are recorded
when it is built (cache entry metadata, prebuilt manifest) and compared before it is loaded.
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

_CHUNK = 1 << 20


def record(path: Path) -> dict:
    """What to store beside a freshly built library."""
    return {"file": path.name, "size": path.stat().st_size, "sha256": sha256(path)}


def problem(path: Path, recorded: dict) -> Optional[str]:
    """None if ``path`` is the file ``recorded`` describes; else what is wrong with it."""
    if not isinstance(recorded, dict) or "size" not in recorded or "sha256" not in recorded:
        return "its size and checksum were never recorded"
    try:
        size = path.stat().st_size
    except OSError:
        return "the library file is missing"
    if size != recorded["size"]:  # checked first: the cheap test that catches truncation
        return f"the library is {size} bytes, {recorded['size']} were built"
    if sha256(path) != recorded["sha256"]:
        return "the library's checksum differs from the one recorded when it was built"
    return None


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
