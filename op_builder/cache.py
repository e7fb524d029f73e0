"""The per-user JIT cache: where built ops live, why it is safe to load from, what in it is apex's.

Layout: <root>/<op>/<key>/{<op>.so, meta.json, build.log}; the precompiled torch headers that op
builds share are entries of the same kind (precompiled_cache.py), their .gch in place of the library.
A finished entry appears in one rename of a fully written directory, so an entry exists whole or
not at all. A build runs in a scratch directory ".tmp-<key>-*" whose owner holds the lock on
".tmp-<key>-*.owner" beside it; a scratch directory whose owner lock is free belongs to a dead
build and is removed. Everything apex writes here is recognisable (meta.json's "apex_cache_entry",
the logs' and locks' first line), so cleaning the cache never touches anything else.
"""
from __future__ import annotations

import getpass
import json
import os
import re
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator, Optional

from . import integrity, lock
from .errors import UnsafeCacheDirError

CACHE_ENV = "APEX_CACHE_DIR"
META = "meta.json"
ENTRY_FORMAT = 1
_TMP_PREFIX = ".tmp-"
_OWNER_SUFFIX = ".owner"
_KEY = re.compile(r"^[0-9a-f]{20}$")
_FAILED_LOG = re.compile(r"^[0-9a-f]{20}\.failed\.log$")
_LOCK_FILE = re.compile(r"^[0-9a-f]{20}\.lock$")
_SCRATCH = re.compile(r"^\.tmp-([0-9a-f]{20}|discard)-[^.]+$")
FAILED_LOG_HEADER = "# apex build log"


# ---- where, and is it safe -------------------------------------------------------------
def root(create: bool = True) -> Path:
    """The cache root: $APEX_CACHE_DIR, else <user cache dir>/apex. Created 0700 and checked on every call."""
    path = configured_root()
    check_private_dir(path, create=create)
    return path


def configured_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured).expanduser().absolute() if configured else default_root()


def default_root() -> Path:
    user_cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(user_cache).absolute() / "apex"


def check_private_dir(path: Path, create: bool = True) -> None:
    """Create ``path`` 0700 if missing (``create``); refuse it if another user owns it, others may
    write to it, or it lies below a directory others may write to that is not sticky (they could
    swap the cache for their own). A library loaded from there would be code someone else chose,
    so this is a refusal, not a warning."""
    problem = _unsafe_parent(path)
    if problem is None and create:
        _make_private(path)
    if problem is None and path.exists():
        problem = _unsafe_itself(path)
    if problem:
        raise UnsafeCacheDirError(f"apex refuses the cache directory {path}: {problem}. {_advice(path)}")


def _unsafe_parent(path: Path) -> Optional[str]:
    parents = {*path.absolute().parents, *path.resolve().parents}
    for parent in sorted(parents, key=lambda p: len(p.parts)):
        try:
            info = parent.stat()
        except OSError:
            continue  # not there yet: created private below
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH) and not info.st_mode & stat.S_ISVTX:
            return (f"its parent {parent} is writable by other users (mode {stat.S_IMODE(info.st_mode):04o}) "
                    f"and not sticky, so they could replace the cache with their own files")
    return None


def _unsafe_itself(path: Path) -> Optional[str]:
    info = path.stat()
    if info.st_uid != os.getuid():
        return (f"it belongs to uid {info.st_uid}, not to you (uid {os.getuid()}), "
                f"so its libraries could be anyone's code")
    if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return (f"it is writable by group or others (mode {stat.S_IMODE(info.st_mode):04o}), "
                f"so its libraries could be anyone's code")
    return None


def _make_private(path: Path) -> None:
    """mkdir -p with every directory it creates 0700 (Path.mkdir gives the parents the umask's mode)."""
    missing = [p for p in [path, *path.parents] if not p.exists()]
    for directory in reversed(missing):
        directory.mkdir(mode=0o700, exist_ok=True)


def _advice(refused: Path) -> str:
    """Never "change the permissions of that directory": it may be shared (/tmp). A private one instead."""
    user = _user_name()
    candidates = []
    if refused.exists() and refused.stat().st_mode & stat.S_ISVTX:
        candidates.append(refused / f"apex-{user}")  # a sticky shared dir (like /tmp) may hold private ones
    candidates += [default_root(), Path(tempfile.gettempdir()) / f"apex-{user}"]
    for candidate in candidates:
        if candidate != refused and _unsafe_parent(candidate) is None and \
                (not candidate.exists() or _unsafe_itself(candidate) is None):
            return (f"Leave its permissions alone (it may be shared) and use a private directory: "
                    f"{CACHE_ENV}={candidate} (apex creates it, mode 0700).")
    return f"Set {CACHE_ENV} to a directory of your own that only you can write, below directories only you or root can write."


def _user_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid())


# ---- entries ---------------------------------------------------------------------------
def entry(op: str, key: str) -> Path:
    return root() / op / key


def op_dir(op: str) -> Path:
    path = root() / op
    check_private_dir(path)
    return path


def lock_path(op: str, key: str) -> Path:
    return op_dir(op) / f"{key}.lock"


def failed_log_path(op: str, key: str, create: bool = True) -> Path:
    """Where a failed build of ``op`` at ``key`` leaves its log (``create``: making the op's folder)."""
    return (op_dir(op) if create else root(create=False) / op) / f"{key}.failed.log"


def entry_problem(entry_dir: Path, op: str, library_file: Optional[str] = None) -> Optional[str]:
    """None if ``entry_dir`` holds a complete, intact build of ``op`` (its ``library_file``, by
    default ``<op>.so``); "missing" if there is none; else what is wrong with it (it is then rebuilt)."""
    if not entry_dir.is_dir():
        return "missing"
    try:
        meta = read_meta(entry_dir)
    except (OSError, ValueError):
        return "its meta.json is missing or unreadable"
    return integrity.problem(entry_dir / (library_file or f"{op}.so"), meta.get("library"))


def read_meta(entry_dir: Path) -> dict:
    return json.loads((entry_dir / META).read_text())


def new_build_dir(op: str, key: str) -> tuple[Path, int]:
    """A private scratch directory for one build, and the descriptor holding its owner lock (close
    it through release_build_dir once the directory is published or removed)."""
    fd, owner = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{key}-", suffix=_OWNER_SUFFIX, dir=op_dir(op))
    lock.claim(fd)  # the lock first, then the directory: never a moment where it looks abandoned
    scratch = Path(owner[: -len(_OWNER_SUFFIX)])
    scratch.mkdir(mode=0o700)
    return scratch, fd


def release_build_dir(scratch: Path, owner_fd: int) -> None:
    """Remove a scratch directory (if still there) and its owner lock."""
    shutil.rmtree(scratch, ignore_errors=True)
    Path(f"{scratch}{_OWNER_SUFFIX}").unlink(missing_ok=True)
    os.close(owner_fd)


def publish(scratch: Path, final: Path, meta: dict, library_file: Optional[str] = None) -> None:
    """Make a finished build visible, atomically: meta.json (with the size and checksum of the
    library, ``library_file`` if not ``<op>.so``) written last, then one rename of the whole directory."""
    # Objects (but the entry's own file: the Python entry's object) and ninja's dependency database
    # go; .ninja_log stays (a few hundred bytes): the compile time of each unit, which
    # benchmarks/build/bench_compile_time.py reports.
    library = scratch / (library_file or f"{meta['op']}.so")
    for leftover in [*scratch.glob("*.o"), scratch / ".ninja_deps"]:
        if leftover != library:
            leftover.unlink(missing_ok=True)
    meta = {"apex_cache_entry": ENTRY_FORMAT, "key": final.name, "library": integrity.record(library), **meta}
    (scratch / META).write_text(json.dumps(meta, indent=2, sort_keys=True))
    if final.exists():  # a corrupt entry being replaced
        discard(final)
    os.rename(scratch, final)


def discard(entry_dir: Path) -> None:
    """Remove an entry in one step (renamed aside first, so no process sees half of it)."""
    aside = Path(tempfile.mkdtemp(prefix=f"{_TMP_PREFIX}discard-", dir=entry_dir.parent))  # no owner: removable
    os.rename(entry_dir, aside / entry_dir.name)
    shutil.rmtree(aside, ignore_errors=True)


def remove_dead_builds(op: str) -> None:
    """Delete scratch directories whose owner died (killed mid-build), and their owner locks."""
    for path in dead_scratch(op_dir(op)):
        shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink(missing_ok=True)


def dead_scratch(directory: Path) -> list[Path]:
    """Scratch directories (and owner locks) in an op's directory whose builder is gone."""
    dead, owned = [], set()
    for owner in directory.glob(f"{_TMP_PREFIX}*{_OWNER_SUFFIX}"):
        scratch = Path(str(owner)[: -len(_OWNER_SUFFIX)])
        owned.add(scratch)
        if not _starts_with(owner, lock.MARKER):
            continue  # its builder is still taking the lock
        fd = lock.abandoned(owner)
        if fd is not None:
            dead += [scratch, owner] if scratch.exists() else [owner]
            os.close(fd)
    # A scratch directory without an owner lock lost it while being removed: finish the job.
    dead += [d for d in directory.iterdir() if _SCRATCH.match(d.name) and d.is_dir() and d not in owned]
    return dead


# ---- what in the cache is apex's ---------------------------------------------------------
def is_entry(path: Path) -> bool:
    """Whether ``path`` is a cache entry apex wrote (its meta.json says so, and names it)."""
    if not (path.is_dir() and _KEY.match(path.name)):
        return False
    try:
        meta = read_meta(path)
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "apex_cache_entry" in meta and meta.get("key") == path.name \
        and meta.get("op") == path.parent.name


def apex_files(cache_root: Path) -> Iterator[tuple[Path, Optional[dict]]]:
    """Everything apex wrote under ``cache_root`` that no running build uses: (path, meta) for
    entries, (path, None) for failed-build logs, dead scratch directories and stale lock files."""
    for directory in sorted(p for p in cache_root.iterdir() if p.is_dir() and not p.is_symlink()):
        for path in sorted(directory.iterdir()):
            if is_entry(path):
                yield path, read_meta(path)
            elif _FAILED_LOG.match(path.name) and _starts_with(path, FAILED_LOG_HEADER):
                yield path, None
            elif _LOCK_FILE.match(path.name) and _is_stale_lock(path):
                yield path, None
        if any(is_entry(p) for p in directory.iterdir()) or list(directory.glob(f"{_TMP_PREFIX}*{_OWNER_SUFFIX}")):
            for path in dead_scratch(directory):
                yield path, None


def _starts_with(path: Path, header: str) -> bool:
    try:
        with open(path, "rb") as file:
            return file.read(len(header)) == header.encode()
    except OSError:
        return False


def _is_stale_lock(path: Path) -> bool:
    """An apex lock file nobody holds (older apex versions left one per build; the pid alone)."""
    text = path.read_text(errors="replace") if path.is_file() else ""
    if not (_starts_with(path, lock.MARKER) or text.strip().isdigit() or text == ""):
        return False
    fd = lock.abandoned(path)
    if fd is None:
        return False
    os.close(fd)
    return True
