"""Where op builds get their precompiled header (precompiled_header.py) and the Python entry's object
(python_entry.py): each built once, then shared.

JIT builds: the per-user cache, as an entry of its own, <cache>/torch-headers.pch/<key>/{apex_torch_headers.h.gch,
meta.json, build.log}, built and published exactly as an op library is (one process builds it under
a lock, in a scratch directory renamed into place; its size and checksum recorded and checked before
each use; a corrupt one rebuilt). A .gch is about 450 MB, so only the MAX_KEPT most recently used are
kept; a build whose .gch is removed meanwhile still succeeds, parsing the header's text instead. A
header that failed to build is not tried again while its failed-build log is there (`make clean`).

Compile checks and prebuilds of several ops (`APEX_BUILD_CUDA_OPS=1`, `compile_check --all`): a
private temporary directory, removed when the run ends; nothing enters the cache.

The Python entry's object (about 1 MB) is kept the same way in <cache>/python-entry.o/<key>/, or in
the run's directory; it is built whether or not the precompiled header is on (APEX_PCH=0), since
without it every op would compile its source again.
"""
from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from . import cache, notice, precompiled_header, toolchain
from .compiler import run_child
from .lock import FileLock
from .precompiled_header import GCH_FILE, HEADER_FILE, HeaderPlan
from .python_entry import OBJECT_FILE, ObjectPlan

# The cache folders of the precompiled headers and of the Python entry's objects: not importable
# names, so never an op's.
CACHE_NAME = "torch-headers.pch"
OBJECT_CACHE_NAME = "python-entry.o"
MAX_KEPT = 2
_MB = 1 << 20
_told_failed: set[str] = set()  # keys whose earlier failure this process has mentioned


def build(header: HeaderPlan, build_dir: Path) -> tuple[Optional[float], str]:
    """Precompile ``header`` into ``build_dir / GCH_FILE`` (its text beside it): (seconds, "") on
    success, (None, the build log) on failure."""
    (build_dir / HEADER_FILE).write_text(header.text)
    return _run_build({"header": str(build_dir / HEADER_FILE), "output": str(build_dir / GCH_FILE),
                       "cxx_flags": list(header.cxx_flags)}, build_dir)


def build_object(obj: ObjectPlan, build_dir: Path) -> tuple[Optional[float], str]:
    """Compile the Python entry's ``obj`` into ``build_dir / OBJECT_FILE``: (seconds, "") on success,
    (None, the build log) on failure."""
    return _run_build({"object": str(obj.source), "output": str(build_dir / OBJECT_FILE),
                       "cxx_flags": list(obj.cxx_flags), "include_dirs": list(obj.include_dirs)}, build_dir)


def _run_build(spec: dict, build_dir: Path) -> tuple[Optional[float], str]:
    """One build child (_build_child.py) over ``spec`` in ``build_dir``: (seconds, "") on success,
    (None, the build log) on failure."""
    spec_path = build_dir / "spec.json"
    spec_path.write_text(json.dumps({**spec, "build_dir": str(build_dir)}, indent=2))
    log_path = build_dir / "build.log"
    started = time.monotonic()
    if run_child(spec_path, log_path, dict(os.environ, PATH=toolchain.build_path())):
        return time.monotonic() - started, ""
    return None, log_path.read_text(errors="replace")


def _why(log: str) -> str:
    """The line of a failed header build that says why (the compiler's error, else the last line)."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower()]
    return (errors or lines or ["no output"])[0]


class JitHeaders:
    """The JIT cache's precompiled headers; ``source_root``: the sources of the op being built
    (recorded, so that `make clean` of that checkout removes the header as it removes its ops)."""

    def __init__(self, source_root: Path):
        self.source_root = source_root

    def gch_for(self, header: HeaderPlan) -> Optional[Path]:
        return self._entry_file(_Kind(CACHE_NAME, GCH_FILE, "it is precompiling torch's headers",
                                      functools.partial(build, header), header.fingerprint,
                                      f"precompiling torch's headers for every op's build - once per torch and "
                                      f"compiler, about 450 MB (APEX_PCH=0 turns this off)",
                                      "precompile torch's headers", "the precompiled torch headers",
                                      "ops build without them, slower", "precompiled torch's headers"),
                                header.key)

    def object_for(self, obj: ObjectPlan) -> Optional[Path]:
        return self._entry_file(_Kind(OBJECT_CACHE_NAME, OBJECT_FILE, "it is compiling apex's Python entry",
                                      functools.partial(build_object, obj), obj.fingerprint,
                                      "compiling apex's Python entry (torch's Python bindings), once for every op",
                                      "compile apex's Python entry", "apex's compiled Python entry",
                                      "each op compiles it itself, slower", "compiled apex's Python entry"),
                                obj.key)

    def _entry_file(self, kind: "_Kind", key: str) -> Optional[Path]:
        """The cache entry's file of ``kind`` and ``key``, built first (once across processes) if need
        be; None when it cannot be had (a failed build, not tried again while its log is there)."""
        entry = cache.entry(kind.cache_name, key)
        failed_log = cache.failed_log_path(kind.cache_name, key)
        if cache.entry_problem(entry, kind.cache_name, kind.file) is not None:
            if failed_log.exists():
                _say_failed_once(key, failed_log, kind)
                return None
            with FileLock(cache.lock_path(kind.cache_name, key), kind.lock_reason):
                problem = cache.entry_problem(entry, kind.cache_name, kind.file)  # another process may have built it
                if problem is not None:
                    if failed_log.exists():
                        return None
                    if problem != "missing":
                        notice.say(f"apex: {kind.the} in {entry} are corrupt ({problem}); rebuilding them")
                    if not self._build(kind, key, entry, failed_log):
                        return None
        try:
            os.utime(entry)  # the most recently used are kept
        except OSError:
            return None  # removed meanwhile (another process keeping its own): build without it
        _keep_most_recent(entry.parent, MAX_KEPT)
        return entry / kind.file

    def _build(self, kind: "_Kind", key: str, entry: Path, failed_log: Path) -> bool:
        cache.remove_dead_builds(kind.cache_name)
        scratch, owner = cache.new_build_dir(kind.cache_name, key)
        try:
            notice.say(f"apex: {kind.building}. Cache: {entry.parent}")
            seconds, log = kind.build(scratch)
            if seconds is None:
                _told_failed.add(key)
                failed_log.write_text(f"{cache.FAILED_LOG_HEADER} of {kind.the} (key {key})\n{log}")
                notice.say(f"apex: could not {kind.what} ({_why(log)}); {kind.without}. "
                           f"Log: {failed_log} (remove it to try again)")
                return False
            meta = {"op": kind.cache_name, "fingerprint": kind.fingerprint, "seconds": round(seconds, 1),
                    "built_at": time.time(), "source_root": str(self.source_root.resolve())}
            cache.publish(scratch, entry, meta, library_file=kind.file)
            size = (entry / kind.file).stat().st_size
            notice.say(f"apex: {kind.built} in {seconds:.0f} s ({size / _MB:.1f} MB)")
            return True
        finally:
            cache.release_build_dir(scratch, owner)


@dataclass(frozen=True)
class _Kind:
    """What the JIT cache keeps beside the op libraries (the header, the Python entry's object), and
    how its build is announced."""

    cache_name: str
    file: str
    lock_reason: str
    build: Callable[[Path], tuple[Optional[float], str]]
    fingerprint: dict
    building: str  # "apex: <building>. Cache: ..."
    what: str      # "could not <what>"
    the: str       # "<the> in <entry> are corrupt"
    without: str   # what happens without it
    built: str     # "apex: <built> in N s"


def _say_failed_once(key: str, failed_log: Path, kind: _Kind) -> None:
    if key not in _told_failed:
        _told_failed.add(key)
        notice.say(f"apex: {kind.without}: {kind.the} failed to build before "
                   f"(log: {failed_log}; remove it to try again)")


def _keep_most_recent(folder: Path, count: int) -> None:
    """Discard all but the ``count`` most recently used entries of ``folder``."""
    entries = []
    for path in folder.iterdir():
        try:
            if cache.is_entry(path):
                entries.append((path.stat().st_mtime, path))
        except OSError:
            continue  # discarded meanwhile by another process
    for _, path in sorted(entries, reverse=True)[count:]:
        try:
            cache.discard(path)
        except OSError:
            pass  # another process got there first


class RunHeaders:
    """One run's precompiled headers and Python entry objects (a compile check, a prebuild): each built
    on first need into a private temporary directory, which ``close`` (or leaving the ``with`` block)
    removes."""

    def __init__(self):
        self.folder = Path(tempfile.mkdtemp(prefix="apex-pch-"))  # 0700, never a fixed name
        self._built: dict[str, Optional[Path]] = {}

    def __enter__(self) -> "RunHeaders":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        shutil.rmtree(self.folder, ignore_errors=True)

    def gch_for(self, header: HeaderPlan) -> Optional[Path]:
        if header.key not in self._built:
            build_dir = self.folder / header.key
            build_dir.mkdir()
            notice.say("apex: precompiling torch's headers, shared by this run's op builds")
            seconds, log = build(header, build_dir)
            if seconds is None:
                notice.say(f"apex: could not precompile torch's headers ({_why(log)}); building without them")
            else:
                notice.say(f"apex: precompiled torch's headers in {seconds:.0f} s")
            self._built[header.key] = build_dir / GCH_FILE if seconds is not None else None
        return self._built[header.key]

    def object_for(self, obj: ObjectPlan) -> Optional[Path]:
        if obj.key not in self._built:
            build_dir = self.folder / obj.key
            build_dir.mkdir()
            seconds, log = build_object(obj, build_dir)
            if seconds is None:
                notice.say(f"apex: could not compile apex's Python entry ({_why(log)}); each op compiles it itself")
            self._built[obj.key] = build_dir / OBJECT_FILE if seconds is not None else None
        return self._built[obj.key]


def for_run(op_count: int) -> Optional[RunHeaders]:
    """The shared builds of a run that builds ``op_count`` ops outside the cache: only when they are
    several (one op's build would pay the header's ~20 s for ~10 s saved), or the header is asked
    for. With APEX_PCH=0 they serve the Python entry's object only (plan_header is None then)."""
    return RunHeaders() if precompiled_header.setting() == "on" or op_count > 1 else None


def jit_status() -> str:
    """What the next JIT build would find of the precompiled headers, for `apex-report`: off, not
    used here (and why), cached (with its size), not built yet, corrupt, or failed (with its log)."""
    from . import all_builders
    from .plan import Purpose, plan_build

    try:
        if precompiled_header.setting() == "off":
            return f"off ({precompiled_header.PCH_ENV}=0): ops build without them"
    except ValueError as error:
        return f"REFUSED: {error}"
    builders = list(all_builders().values())
    header = precompiled_header.plan_header(plan_build(builders[0](), Purpose.JIT)) if builders else None
    if header is None:
        return "not used here (GCC on Linux only, not ROCm)"
    try:
        entry = cache.root(create=False) / CACHE_NAME / header.key
    except cache.UnsafeCacheDirError:
        return "cache refused (see cache dir)"
    problem = cache.entry_problem(entry, CACHE_NAME, GCH_FILE)
    if problem is None:
        return f"cached, {(entry / GCH_FILE).stat().st_size / _MB:.0f} MB ({entry})"
    failed_log = cache.failed_log_path(CACHE_NAME, header.key, create=False)
    if failed_log.exists():
        return f"failed to build: ops build without them (log {failed_log}; remove it to try again)"
    if problem != "missing":
        return f"corrupt, rebuilt on the next op build ({problem})"
    return "not built: built once, before the next op build (about 450 MB)"
