"""Compile ops' full source sets (CPU + GPU kernels) without a GPU, to check that they build.

    TORCH_CUDA_ARCH_LIST=9.0 python -m apex.op_builder.compile_check amp_C [more ops] [--fast]
    python -m apex.op_builder.compile_check --all --fast

A JIT build without a visible GPU compiles only the CPU sources; this is how a kernel author
without a GPU (and CI) keeps the CUDA sources compiling. Builds go to private temporary
directories (nothing enters the cache); a failed build's directory, with its log, is kept and
named. --fast skips what only matters for running the kernels (device code generation beyond
PTX, optimisation): it says whether the sources compile, in a fraction of the time. Checking
several ops precompiles torch's headers once for the run (precompiled_cache.py; APEX_PCH=0: not).
"""
from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Optional

from . import precompiled_cache
from .compiler import compile_library
from .errors import OpBuildError
from .plan import Purpose, plan_build
from .precompiled_cache import RunHeaders
from .registry import all_builders, builder_for


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="*", help="op names, e.g. amp_C")
    parser.add_argument("--all", action="store_true", help="every registered op")
    parser.add_argument("--fast", action="store_true", help="PTX only, unoptimised: does it compile?")
    args = parser.parse_args(argv)
    names = list(all_builders()) if args.all else args.ops
    if not names:
        parser.error("name ops to check, or --all")
    headers = precompiled_cache.for_run(len(names))  # several ops: torch's headers precompiled once, not kept
    try:
        failed = sum(not _check(name, args.fast, headers) for name in names)
    finally:
        if headers:
            headers.close()
    return 1 if failed else 0


def _check(name: str, fast: bool, headers: Optional[RunHeaders]) -> bool:
    """Compile op ``name``; say how it went; whether it compiled."""
    plan = plan_build(builder_for(name), Purpose.CHECK, fast=fast)
    build_dir = Path(tempfile.mkdtemp(prefix=f"apex-check-{name}-"))  # private (0700), never a fixed name
    try:
        seconds = compile_library(plan, build_dir, failed_log=build_dir / "failed.log", headers=headers)
    except OpBuildError as error:
        print(error, file=sys.stderr)
        if not (build_dir / "failed.log").exists():  # refused before compiling: nothing to keep
            shutil.rmtree(build_dir, ignore_errors=True)
        return False
    shutil.rmtree(build_dir, ignore_errors=True)
    print(f"{name}: compiled ({plan.target()}{', fast' if fast else ''}) in {seconds:.0f} s", flush=True)
    return True


if __name__ == "__main__":
    sys.exit(main())
