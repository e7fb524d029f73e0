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
import subprocess
import sys
import time
from pathlib import Path

from . import notice, toolchain, unity
from .cache import FAILED_LOG_HEADER
from .errors import build_error_from_log
from .plan import BuildPlan

VERBOSE_ENV = "APEX_JIT_VERBOSE"
_CHILD = Path(__file__).resolve().parent / "_build_child.py"


def compile_library(plan: BuildPlan, build_dir: Path, failed_log: Path) -> float:
    """Build ``plan`` into ``build_dir`` (its library: ``build_dir / plan.library_file``); return the
    seconds it took. On failure the log is saved to ``failed_log`` and OpBuildError is raised."""
    toolchain.check(plan.op, with_cuda=plan.with_gpu)
    spec_path = build_dir / "spec.json"
    sources = unity.group_sources(list(plan.sources), build_dir, unity.build_jobs())
    spec_path.write_text(json.dumps(plan.child_spec(build_dir, sources), indent=2))
    started = time.monotonic()
    log = _run_child(plan, spec_path, build_dir / "build.log")
    if log is not None:
        failed_log.write_text(f"{FAILED_LOG_HEADER} of op '{plan.op}' (key {plan.key})\n{log}")
        raise build_error_from_log(plan.op, log, failed_log)
    return time.monotonic() - started


def child_env(plan: BuildPlan) -> dict:
    """The build child's environment: ninja findable by torch, the approved CUDA toolkit and archs."""
    env = dict(os.environ, PATH=toolchain.build_path())
    if plan.with_gpu and not plan.fingerprint["hip"]:
        env["TORCH_CUDA_ARCH_LIST"] = plan.archs
        env["CUDA_HOME"] = str(toolchain.cuda_home())  # the toolkit toolchain.check approved, for torch too
    return env


def _run_child(plan: BuildPlan, spec_path: Path, log_path: Path):
    """Run the child, its output into ``log_path`` (and stderr with APEX_JIT_VERBOSE=1). None on success, else the log."""
    verbose = os.environ.get(VERBOSE_ENV, "0") not in ("", "0")
    lifeline_read, lifeline_write = os.pipe()
    try:
        with open(log_path, "w") as log_file:
            child = subprocess.Popen(
                [sys.executable, str(_CHILD), str(spec_path), str(lifeline_read)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True,
                env=child_env(plan), cwd=spec_path.parent, start_new_session=True, pass_fds=(lifeline_read,))
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
    return None if returncode == 0 else log_path.read_text()
