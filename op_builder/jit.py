"""First use of an op: a prebuilt library if the wheel has a matching one, else a cached build,
else one compiled now (once across processes), then loaded into this process.

    load_op("my_op")  ->  Path of the loaded library (its torch.ops.apex.* ops registered)

An op library is a plain shared library (no Python module) loaded with torch.ops.load_library.
Compilation announces itself (op, why, where); cache hits are silent. A library is checked against the size
and checksum recorded when it was built before it is loaded: a corrupt one is rebuilt.
"""
from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Optional

from . import cache, integrity, notice, paths, registry
from .archs import covers_visible_gpus
from .builder import OpBuilder
from .compiler import compile_library
from .errors import OpNotCompatibleError, UnsafeCacheDirError
from .lock import FileLock
from .plan import BuildPlan, Purpose, plan_build
from .precompiled_cache import JitHeaders

# Fingerprint fields a prebuilt library may differ in from a JIT build and still serve: it was
# built for the GPU archs of the build machine (checked separately), and for no particular CPU
# (cpu_flags: only JIT builds target the CPU they run on).
_PREBUILT_FREE_FIELDS = {"gpu", "archs", "nvcc_flags", "cpu_flags"}

_loaded: dict[str, Path] = {}
_op_locks: dict[str, threading.RLock] = {}
_op_locks_guard = threading.Lock()


def load_op(name: str) -> Path:
    """Load op library ``name`` into this process (once; thread-safe), building it on first use.

    Returns the loaded library's Path; its ops are then in torch.ops (and its after_load() hook has run)."""
    with _op_locks_guard:
        op_lock = _op_locks.setdefault(name, threading.RLock())
    with op_lock:  # per op: loading one op never waits for another op's build
        if name not in _loaded:
            _loaded[name] = load_builder(registry.builder_for(name))
        return _loaded[name]


def load_builder(builder: OpBuilder) -> Path:
    """Load ``builder``'s op: prebuilt, else cached, else compiled now; then its after_load() hook."""
    compatible, reason = builder.is_compatible()
    if not compatible:
        raise OpNotCompatibleError(f"apex op '{builder.NAME}' cannot be used here: {reason}")
    plan = plan_build(builder, Purpose.JIT)
    library = usable_prebuilt(plan) or cached_or_built(builder, plan)
    loaded = _load(plan, library)
    builder.after_load()
    return loaded


def cached_or_built(builder: OpBuilder, plan: BuildPlan) -> Path:
    """The cache entry's library for ``plan``, building (or rebuilding a corrupt) entry first."""
    entry = cache.entry(plan.op, plan.key)
    if cache.entry_problem(entry, plan.op) is not None:
        with FileLock(cache.lock_path(plan.op, plan.key), f"it is compiling apex op '{plan.op}'"):
            problem = cache.entry_problem(entry, plan.op)  # another process may have built it meanwhile
            if problem is not None:
                if problem != "missing":
                    notice.say(f"apex: the cached build of '{plan.op}' in {entry} is corrupt ({problem}); rebuilding it")
                _build(builder, plan, entry)
    return entry / plan.library_file


def prebuilt_manifest(name: str) -> Optional[dict]:
    manifest = paths.PREBUILT_DIR / f"{name}.json"
    return json.loads(manifest.read_text()) if manifest.is_file() else None


def skipped_prebuilds() -> dict[str, str]:
    """op -> why the wheel was built without it, though asked to prebuild it."""
    path = paths.PREBUILT_DIR / paths.PREBUILD_SKIPPED
    return json.loads(path.read_text()) if path.is_file() else {}


def usable_prebuilt(plan: BuildPlan) -> Optional[Path]:
    """The prebuilt library if the wheel has one that serves ``plan``; says why one that exists does not."""
    path, why_not = find_prebuilt(plan)
    if why_not:
        notice.say(f"apex: the prebuilt '{plan.op}' {why_not}; using a JIT build instead")
    return path


def find_prebuilt(plan: BuildPlan) -> tuple[Optional[Path], str]:
    """(path of a prebuilt library usable here, "") or (None, why the wheel's one is not; "" if none)."""
    manifest = prebuilt_manifest(plan.op)
    if manifest is None:
        return None, ""
    built = manifest["fingerprint"]
    differing = sorted(k for k in plan.fingerprint.keys() | built.keys()
                       if k not in _PREBUILT_FREE_FIELDS and plan.fingerprint.get(k) != built.get(k))
    if plan.with_gpu and not (built["gpu"] and covers_visible_gpus(built["archs"])):
        differing.append("archs")
    if differing:
        return None, f"does not match this installation ({', '.join(differing)} differ)"
    path = paths.PREBUILT_DIR / manifest["file"]
    problem = integrity.problem(path, manifest)
    if problem:
        return None, f"is corrupt ({problem})"
    return path, ""


def _build(builder: OpBuilder, plan: BuildPlan, entry: Path) -> None:
    cache.remove_dead_builds(plan.op)
    scratch, owner = cache.new_build_dir(plan.op, plan.key)
    try:
        notice.say(f"apex: compiling op '{plan.op}' for torch {plan.fingerprint['torch']}, {plan.target()} - "
                   f"first use, once; C++ ops take about a minute, CUDA ops a few minutes. Cache: {entry.parent}")
        # The cache is the user's own and outlives this build: the precompiled torch headers built
        # for it serve every later op's build too (APEX_PCH=0: none).
        seconds = compile_library(plan, scratch, failed_log=cache.failed_log_path(plan.op, plan.key),
                                  headers=JitHeaders(builder.source_root))
        meta = {"op": plan.op, "fingerprint": plan.fingerprint, "seconds": round(seconds, 1),
                "built_at": time.time(), "source_root": str(builder.source_root.resolve())}
        cache.publish(scratch, entry, meta)
        notice.say(f"apex: built '{plan.op}' in {seconds:.0f} s")
    finally:
        cache.release_build_dir(scratch, owner)


def _load(plan: BuildPlan, library: Path) -> Path:
    import torch  # the library links against libtorch, which must be loaded first

    torch.ops.load_library(str(library))
    return library


def build_status(builder: OpBuilder) -> str:
    """What the next load_op of this op would do: 'prebuilt', 'cached', 'not built', or why it cannot."""
    plan = plan_build(builder, Purpose.JIT)
    if find_prebuilt(plan)[0] is not None:
        return "prebuilt"
    try:
        problem = cache.entry_problem(cache.root(create=False) / plan.op / plan.key, plan.op)
    except UnsafeCacheDirError:
        return "cache refused (see cache dir)"
    if problem is None:
        return "cached"
    return "not built" if problem == "missing" else f"corrupt cache entry, rebuilt on use ({problem})"
