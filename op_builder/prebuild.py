"""Prebuilding ops into the wheel: APEX_BUILD_<NAME>=1, APEX_BUILD_CUDA_OPS=1, APEX_BUILD_CPP_OPS=1.

setup.py asks ``requested()`` (environment variables only: a plain ``pip install .`` never imports
torch, not even to generate metadata) and declares a placeholder extension per requested op, which
makes the wheel platform-specific. Its build_ext command (``BuildPrebuiltOps``) then plans each op
(``Purpose.PREBUILD``: GPU kernels for every CUDA op, portable CPU code) and builds it exactly as a
JIT build would (same plan, same build child) into apex/op_builder/_prebuilt/, beside a manifest
(fingerprint, size, checksum) that the loader checks. An op that cannot be built here (incompatible,
CPU-only torch, no nvcc) is skipped with its reason, said once, on the terminal even when pip hides
the build output, and recorded in _prebuilt/skipped.json (apex.report shows it); it compiles on first use instead, so the
install does not fail for it. A compile error in an op that can be built does fail the install.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

from setuptools import Extension
from setuptools.command.build_ext import build_ext

from . import integrity, notice, paths, precompiled_cache, toolchain
from .builder import OpBuilder
from .compiler import PrecompiledHeaders, compile_library
from .errors import OpBuildError
from .plan import BuildPlan, Purpose, plan_build
from .registry import all_builders

PREBUILT_PACKAGE = "apex.op_builder._prebuilt"


def _enabled(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def requested(env=os.environ) -> list[type[OpBuilder]]:
    """Builder classes whose own variable or group variable asks for a prebuild."""
    return [cls for cls in all_builders().values()
            if _enabled(env.get(cls.build_var())) or _enabled(env.get(cls.group_var()))]


def placeholder_extensions(env=os.environ) -> list[Extension]:
    """One extension per requested op, for setup(): built by BuildPrebuiltOps, not by setuptools."""
    return [Extension(f"{PREBUILT_PACKAGE}.{cls.NAME}", sources=[]) for cls in requested(env)]


class BuildPrebuiltOps(build_ext):
    """build_ext for the placeholders: each op through its BuildPlan, as on first use."""

    def run(self) -> None:
        target = paths.PREBUILT_DIR if self.inplace else Path(self.build_lib, *PREBUILT_PACKAGE.split("."))
        names = [ext.name.rsplit(".", 1)[1] for ext in self.extensions]
        self._written = prebuild(names, target)

    def get_outputs(self) -> list[str]:
        return [str(p) for p in getattr(self, "_written", [])]


def prebuild(names: list[str], target: Path) -> list[Path]:
    """Build ops ``names`` into ``target``; return the files written (libraries, manifests, skipped.json)."""
    target.mkdir(parents=True, exist_ok=True)
    written, skipped, buildable = [], {}, []
    for name in names:
        builder = all_builders()[name]()
        plan = plan_build(builder, Purpose.PREBUILD)
        reason = cannot_build(builder, plan)
        if reason:
            notice.to_terminal(f"apex: not prebuilding '{name}': {reason}; it will compile on first use instead")
            skipped[name] = reason
        else:
            buildable.append(plan)
    headers = precompiled_cache.for_run(len(buildable))  # several ops: torch's headers precompiled once
    try:
        for plan in buildable:
            notice.to_terminal(f"apex: prebuilding '{plan.op}' ({plan.target()})")
            written += _build_into(plan, target, headers)
    finally:
        if headers:
            headers.close()
    if skipped:
        (target / paths.PREBUILD_SKIPPED).write_text(json.dumps(skipped, indent=2, sort_keys=True))
        written.append(target / paths.PREBUILD_SKIPPED)
    return written


def cannot_build(builder: OpBuilder, plan: BuildPlan) -> str:
    """Why ``plan`` cannot be built here, or "" if it can."""
    compatible, reason = builder.is_compatible()
    if not compatible:
        return reason
    try:
        toolchain.check(plan.op, with_cuda=plan.with_gpu)
    except OpBuildError as error:
        return f"{error.summary} ({error.hint.rstrip('.')})" if error.hint else error.summary
    return ""


def _build_into(plan: BuildPlan, target: Path, headers: PrecompiledHeaders | None) -> list[Path]:
    build_dir = Path(tempfile.mkdtemp(prefix=f"apex-prebuild-{plan.op}-"))
    failed_log = Path(tempfile.mkdtemp(prefix=f"apex-prebuild-{plan.op}-log-")) / "failed.log"  # kept: the error names it
    try:
        compile_seconds = compile_library(plan, build_dir, failed_log=failed_log, headers=headers)
        library = target / plan.library_file
        shutil.copyfile(build_dir / plan.library_file, library)
    finally:
        shutil.rmtree(build_dir, ignore_errors=True)
        if not failed_log.exists():
            failed_log.parent.rmdir()
    manifest = target / f"{plan.op}.json"
    manifest.write_text(json.dumps({**integrity.record(library), "fingerprint": plan.fingerprint,
                                    "seconds": round(compile_seconds, 1)}, indent=2, sort_keys=True))
    return [library, manifest]

