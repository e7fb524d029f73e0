"""First use of an op: find a prebuilt module, else a cached build, else compile one.

    load_op("amp_C")  ->  the compiled pybind module (its torch.ops.apex.* ops registered)

Compilation announces itself on stderr (op, why, where); cache hits are silent.
"""
from __future__ import annotations

import ctypes
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import ModuleType

from op_builder import cache, paths, registry, toolchain
from op_builder.builder import OpBuilder
from op_builder.errors import OpBuildError, OpNotCompatibleError, failing_command, first_error_lines, hint_for_log
from op_builder.lock import FileLock

VERBOSE_ENV = "APEX_JIT_VERBOSE"
_PR_SET_PDEATHSIG = 1
# Fingerprint fields a prebuilt module may differ in from a JIT build and still serve:
# it was built for the GPU archs of the build machine (checked separately), and for no
# particular CPU (host_cpu_flags: only JIT builds target the CPU they run on).
_PREBUILT_FREE_FIELDS = {"gpu", "archs", "nvcc_flags", "cpu_flags"}

_loaded: dict[str, ModuleType] = {}
_loading = threading.RLock()


def load_op(name: str) -> ModuleType:
    """The compiled module of op ``name`` (e.g. "amp_C"), building it on first use."""
    with _loading:
        if name not in _loaded:
            _loaded[name] = load_builder(registry.builder_for(name))
        return _loaded[name]


def load_builder(builder: OpBuilder) -> ModuleType:
    """Load ``builder``'s op: prebuilt, else cached, else compiled now (once across processes)."""
    compatible, reason = builder.is_compatible()
    if not compatible:
        raise OpNotCompatibleError(f"apex op '{builder.NAME}' cannot be used here: {reason}")
    with_gpu = builder.wants_gpu_build()
    fingerprint = builder.fingerprint(with_gpu)
    prebuilt, mismatch = find_prebuilt(builder, fingerprint)
    if prebuilt is not None:
        return _import_extension(builder.NAME, prebuilt)
    if mismatch:
        print(f"apex: the prebuilt '{builder.NAME}' does not match this installation ({', '.join(mismatch)} "
              "differ); using a JIT build instead", file=sys.stderr)
    key = builder.key(fingerprint)
    entry = cache.entry(builder.NAME, key)
    if not cache.is_complete(entry, builder.NAME):
        lock_path = cache.op_dir(builder.NAME) / f"{key}.lock"
        with FileLock(lock_path, f"it is compiling apex op '{builder.NAME}'"):
            if not cache.is_complete(entry, builder.NAME):  # another process may have built it meanwhile
                _build(builder, fingerprint, key, entry)
    return _import_extension(builder.NAME, entry / f"{builder.NAME}.so")


def prebuilt_manifest(name: str) -> dict | None:
    manifest = paths.PREBUILT_DIR / f"{name}.json"
    return json.loads(manifest.read_text()) if manifest.is_file() else None


def find_prebuilt(builder: OpBuilder, fingerprint: dict) -> tuple[Path | None, list[str]]:
    """(path of a prebuilt module usable here, []) or (None, fingerprint fields that rule it out)."""
    manifest = prebuilt_manifest(builder.NAME)
    if manifest is None:
        return None, []
    built = manifest["fingerprint"]
    differing = sorted(k for k in fingerprint.keys() | built.keys()
                       if k not in _PREBUILT_FREE_FIELDS and fingerprint.get(k) != built.get(k))
    if fingerprint["gpu"] and not (built["gpu"] and builder.covers_visible_gpus(built["archs"])):
        differing.append("archs")
    if differing:
        return None, differing
    return paths.PREBUILT_DIR / manifest["file"], []


def _build(builder: OpBuilder, fingerprint: dict, key: str, entry: Path) -> None:
    name = builder.NAME
    cache.remove_dead_builds(name)
    build_dir = cache.new_build_dir(name, key)
    target = f"GPU archs {fingerprint['archs']}" if fingerprint["gpu"] else "CPU only (no GPU visible)"
    print(f"apex: compiling op '{name}' for torch {fingerprint['torch']}, {target} - first use, once; "
          f"C++ ops take about a minute, CUDA ops a few minutes. Cache: {entry.parent}", file=sys.stderr, flush=True)
    try:
        seconds = compile_module(builder, fingerprint, build_dir, failed_log=entry.parent / f"{key}.failed.log")
    except BaseException:
        shutil.rmtree(build_dir, ignore_errors=True)
        raise
    meta = {"fingerprint": fingerprint, "seconds": round(seconds, 1), "built_at": time.time(),
            "source_root": str(builder.source_root)}
    cache.publish(build_dir, entry, meta)
    print(f"apex: built '{name}' in {seconds:.0f} s", file=sys.stderr, flush=True)


def compile_module(builder: OpBuilder, fingerprint: dict, build_dir: Path, failed_log: Path) -> float:
    """Compile, link and test-import ``builder``'s module into ``build_dir``; return the seconds it took.

    On failure the log is saved to ``failed_log`` and OpBuildError is raised."""
    with_gpu = fingerprint["gpu"]
    toolchain.check(builder.NAME, with_cuda=with_gpu)
    spec = {
        "name": builder.NAME,
        "sources": [str(s) for s in builder.sources(with_gpu)],
        "include_dirs": builder.compile_include_dirs(with_gpu),
        "cxx_flags": builder.cxx_flags() + fingerprint["cpu_flags"],
        "nvcc_flags": builder.nvcc_flags() if with_gpu else [],
        "build_dir": str(build_dir),
        "with_gpu": with_gpu,
    }
    (build_dir / "spec.json").write_text(json.dumps(spec, indent=2))
    started = time.monotonic()
    log = _run_child(spec, build_dir, fingerprint)
    if log is not None:
        failed_log.write_text(log)
        raise _build_error(builder.NAME, log, failed_log)
    return time.monotonic() - started


def _run_child(spec: dict, build_dir: Path, fingerprint: dict) -> str | None:
    """Run the build in a child process, logging to build.log. Returns None on success, else the log."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(paths.PACKAGE_DIR.parent), env.get("PYTHONPATH")]))
    if spec["with_gpu"] and not fingerprint["hip"]:
        env["TORCH_CUDA_ARCH_LIST"] = fingerprint["archs"]
        env["CUDA_HOME"] = str(toolchain.cuda_home())  # the toolkit toolchain.check approved, for torch too
    verbose = os.environ.get(VERBOSE_ENV, "0") not in ("", "0")
    log_path = build_dir / "build.log"
    with open(log_path, "w") as log_file:
        child = subprocess.Popen([sys.executable, "-m", "op_builder._build_child", str(build_dir / "spec.json")],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                                 cwd=build_dir, preexec_fn=_die_with_parent)
        assert child.stdout is not None
        for line in child.stdout:
            log_file.write(line)
            if verbose:
                sys.stderr.write(line)
        returncode = child.wait()
    return None if returncode == 0 else log_path.read_text()


def _build_error(name: str, log: str, log_path: Path) -> OpBuildError:
    if "FAILED:" in log:
        summary = "compilation failed"
    elif "ImportError" in log:
        summary = "the module compiled but does not load"
    else:
        summary = "the build failed"
    return OpBuildError(name, summary, errors=first_error_lines(log), command=failing_command(log),
                        log_path=log_path, hint=hint_for_log(log))


def _die_with_parent() -> None:
    """In the build child: get SIGKILLed when the parent dies, so a killed import stops its build."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass  # not Linux/glibc: the orphaned build finishes into its scratch dir, which is then removed


def _import_extension(name: str, path: Path) -> ModuleType:
    import torch  # noqa: F401  the module links against libtorch, which must be loaded first

    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise ImportError(f"apex: cannot load op '{name}' from {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def build_status(builder: OpBuilder) -> str:
    """'prebuilt', 'cached' or 'not built': what the next load_op of this op would do."""
    fingerprint = builder.fingerprint(builder.wants_gpu_build())
    if find_prebuilt(builder, fingerprint)[0] is not None:
        return "prebuilt"
    if cache.is_complete(cache.entry(builder.NAME, builder.key(fingerprint)), builder.NAME):
        return "cached"
    return "not built"
