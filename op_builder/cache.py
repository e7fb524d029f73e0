"""The per-user JIT cache: where built ops live, and why it is safe to load from.

Layout: <root>/<op name>/<key>/{<op name>.so, meta.json, build.log}
A finished entry appears in one rename of a fully written directory, so an entry
either exists whole or not at all; a build killed half way leaves only a
".tmp-*" directory, which no load ever looks at and the next build removes.
"""
from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from op_builder.errors import UnsafeCacheDirError

CACHE_ENV = "APEX_CACHE_DIR"
_TMP_PREFIX = ".tmp-"
META = "meta.json"


def root() -> Path:
    """The cache root: $APEX_CACHE_DIR, else <user cache dir>/apex. Created 0700, checked on every call."""
    configured = os.environ.get(CACHE_ENV)
    if configured:
        path = Path(configured).expanduser()
    else:
        user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        path = Path(user_cache) / "apex"
    ensure_private_dir(path)
    return path


def ensure_private_dir(path: Path) -> None:
    """Create ``path`` 0700 if missing; refuse it if another user owns it or others may write to it.

    A module loaded from a directory someone else can write is code someone else
    chose, so this is a refusal, not a warning.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise UnsafeCacheDirError(
            f"apex refuses the cache directory {path}: it belongs to uid {info.st_uid}, not to you "
            f"(uid {os.getuid()}), so its modules could be anyone's code. "
            f"Set {CACHE_ENV} to a directory of your own.")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise UnsafeCacheDirError(
            f"apex refuses the cache directory {path}: it is writable by group or others "
            f"(mode {stat.S_IMODE(info.st_mode):04o}). Run `chmod 700 {path}` or set {CACHE_ENV}.")


def entry(op: str, key: str) -> Path:
    return root() / op / key


def op_dir(op: str) -> Path:
    path = root() / op
    ensure_private_dir(path)
    return path


def is_complete(entry_dir: Path, op: str) -> bool:
    return (entry_dir / META).is_file() and (entry_dir / f"{op}.so").is_file()


def new_build_dir(op: str, key: str) -> Path:
    """A private scratch directory for one build, named so a dead builder's leftovers can be recognised."""
    return Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}{key}-{os.getpid()}-", dir=op_dir(op)))


def publish(build_dir: Path, final: Path, meta: dict) -> None:
    """Make a finished build visible, atomically: write meta.json last, then rename the directory."""
    for leftover in list(build_dir.glob("*.o")) + list(build_dir.glob("*.cuda.o")) + [build_dir / ".ninja_deps"]:
        leftover.unlink(missing_ok=True)
    (build_dir / META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    if final.exists():  # a previous, incomplete entry (should not happen: entries appear by rename)
        shutil.rmtree(final)
    os.rename(build_dir, final)


def remove_dead_builds(op: str) -> None:
    """Delete scratch directories whose builder process no longer exists (killed mid-build)."""
    for scratch in op_dir(op).glob(f"{_TMP_PREFIX}*"):
        try:
            pid = int(scratch.name[len(_TMP_PREFIX):].split("-")[1])
        except (IndexError, ValueError):
            continue
        if not _alive(pid):
            shutil.rmtree(scratch, ignore_errors=True)


def read_meta(entry_dir: Path) -> dict:
    return json.loads((entry_dir / META).read_text())


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
