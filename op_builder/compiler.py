"""Carry out one BuildPlan: compile, link and test-load the op library in a child process.

The child (_build_child.py) runs in a session of its own, so that the whole build (the child,
ninja and every compiler ninja starts in its own process group) can be told apart from everything
else and dies with its owner: the child watches a pipe whose only writer is this process, and
kills the session once it reads end-of-file, which happens however this process ends (SIGKILL
included). Nothing runs between fork and exec (no preexec_fn), which is what keeps starting it
safe in a multi-threaded torch process.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Optional, Protocol

from . import notice, precompiled_header, python_entry, toolchain, unity
from .cache import FAILED_LOG_HEADER
from .errors import build_error_from_log
from .plan import BuildPlan
from .precompiled_header import HeaderPlan
from .python_entry import ObjectPlan

VERBOSE_ENV = "APEX_JIT_VERBOSE"
_CHILD = Path(__file__).resolve().parent / "_build_child.py"


class PrecompiledHeaders(Protocol):
    """Where a build gets its precompiled header and the Python entry's object (precompiled_cache.py:
    the JIT cache, or one run's)."""

    def gch_for(self, header: HeaderPlan) -> Optional[Path]:
        """The .gch of ``header``, built first if need be; None if there is none to use."""

    def object_for(self, obj: ObjectPlan) -> Optional[Path]:
        """The object file of ``obj``, built first if need be; None if there is none to use."""


def compile_library(plan: BuildPlan, build_dir: Path, failed_log: Path,
                    headers: Optional[PrecompiledHeaders] = None) -> float:
    """Build ``plan`` into ``build_dir`` (its library: ``build_dir / plan.library_file``); return the
    seconds it took. Units that include torch's dispatcher headers use the precompiled header from
    ``headers`` (if given and usable here), and the library links the Python entry's object from
    there (else compiles its source as a unit of its own). On failure the log is saved to
    ``failed_log`` and OpBuildError is raised."""
    toolchain.check(plan.op, with_cuda=plan.with_gpu)
    header = precompiled_header.plan_header(plan) if headers else None
    with ThreadPoolExecutor(max_workers=1) as beside:
        # The precompiled header and the Python entry's object are one long compile each when first
        # needed (~20 and ~18 CPU s on a 2-core machine): with a second job free they build side by side.
        header_gch = (beside.submit(headers.gch_for, header)
                      if header is not None and unity.build_jobs() > 1 and _uses(header, plan, list(plan.sources))
                      else None)
        entry_object, entry_source = _python_entry(plan, build_dir, headers)
        sources = unity.group_sources(list(plan.sources) + entry_source, build_dir, unity.build_jobs())
        precompiled = None
        if header is not None and _uses(header, plan, sources):
            gch = header_gch.result() if header_gch else headers.gch_for(header)
            precompiled = _with_precompiled_header(plan, sources, build_dir, header, gch) if gch else None
    ldflags = [str(entry_object)] if entry_object else []
    started = time.monotonic()
    try:
        log = _compile(plan, build_dir, *(precompiled or (sources, [])), ldflags)
        if log is not None and precompiled and precompiled_header.broke_build(log):
            notice.say(f"apex: op '{plan.op}' did not build with the precompiled torch headers "
                       f"({precompiled_header.broke_build(log)}); building it without them")
            log = _compile(plan, build_dir, sources, [], ldflags)
    finally:
        if precompiled:
            precompiled_header.unlink(build_dir)  # a built library never points at the shared .gch
    if log is not None:
        failed_log.write_text(f"{FAILED_LOG_HEADER} of op '{plan.op}' (key {plan.key})\n{log}")
        raise build_error_from_log(plan.op, log, failed_log)
    refused = precompiled and precompiled_header.rejection((build_dir / "build.log").read_text(errors="replace"))
    if refused:
        notice.say(f"apex: GCC did not use the precompiled torch headers for op '{plan.op}' ({refused}); "
                   f"it built, parsing them instead (slower). Build log: {build_dir / 'build.log'}")
    return time.monotonic() - started


def _python_entry(plan: BuildPlan, build_dir: Path,
                  headers: Optional[PrecompiledHeaders]) -> tuple[Optional[Path], list[Path]]:
    """(the Python entry's shared object to link, copied into ``build_dir`` so that no other process
    can discard it meanwhile, []) or, where there is none, (None, its source as one more unit of this
    build; [] for sources without one)."""
    obj = python_entry.plan_object(plan) if headers else None
    shared = headers.object_for(obj) if obj else None
    if shared is not None:
        try:
            return Path(shutil.copy(shared, build_dir / python_entry.OBJECT_FILE)), []
        except OSError:
            pass  # discarded meanwhile: compile it here
    source = python_entry.find_source(plan)
    return None, [source] if source else []


def _uses(header: HeaderPlan, plan: BuildPlan, sources: list[Path]) -> bool:
    """Whether a unit of ``sources`` would use ``header``."""
    return bool(precompiled_header.units_using(header, sources, [Path(d) for d in plan.include_dirs]))


def _with_precompiled_header(plan: BuildPlan, sources: list[Path], build_dir: Path, header: HeaderPlan,
                             gch: Path) -> tuple[list[Path], list[str]]:
    """(sources, extra C++ flags) that compile ``plan``'s units with ``header``'s .gch ``gch``."""
    # -Winvalid-pch: when GCC refuses the .gch, the build log says why.
    include_dirs = [Path(d) for d in plan.include_dirs]
    return precompiled_header.use_in(header, gch, sources, build_dir, include_dirs), ["-Winvalid-pch"]


def _compile(plan: BuildPlan, build_dir: Path, sources: list[Path], extra_cxx_flags: list[str],
             ldflags: list[str]) -> Optional[str]:
    """One run of the build child over ``sources``: None on success, else the build log."""
    spec = plan.child_spec(build_dir, sources)
    spec["cxx_flags"] += extra_cxx_flags
    spec["ldflags"] = ldflags
    spec_path = build_dir / "spec.json"
    spec_path.write_text(json.dumps(spec, indent=2))
    log_path = build_dir / "build.log"
    return None if run_child(spec_path, log_path, child_env(plan)) else log_path.read_text(errors="replace")


def child_env(plan: BuildPlan) -> dict:
    """The build child's environment: ninja findable by torch, the approved CUDA toolkit and archs."""
    env = dict(os.environ, PATH=toolchain.build_path())
    if plan.with_gpu and not plan.fingerprint["hip"]:
        env["TORCH_CUDA_ARCH_LIST"] = plan.archs
        env["CUDA_HOME"] = str(toolchain.cuda_home())  # the toolkit toolchain.check approved, for torch too
    return env


def run_child(spec_path: Path, log_path: Path, env: dict) -> bool:
    """Run the build child on ``spec_path``, its output into ``log_path`` (and stderr with
    APEX_JIT_VERBOSE=1); whether it succeeded."""
    verbose = os.environ.get(VERBOSE_ENV, "0") not in ("", "0")
    lifeline_read, lifeline_write = os.pipe()
    try:
        with open(log_path, "w") as log_file:
            child = subprocess.Popen(
                [sys.executable, str(_CHILD), str(spec_path), str(lifeline_read)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                env=env, cwd=spec_path.parent, start_new_session=True, pass_fds=(lifeline_read,))
            os.close(lifeline_read)
            lifeline_read = -1
            assert child.stdout is not None
            for line in child.stdout:
                log_file.write(line)
                if verbose:
                    notice.say(line.rstrip("\n"))
            returncode = child.wait()
    finally:
        # However we leave (an exception, Ctrl-C), the child sees end-of-file and ends its build.
        os.close(lifeline_write)
        if lifeline_read >= 0:
            os.close(lifeline_read)
    return returncode == 0
