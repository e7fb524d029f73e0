"""Compile an op's full source set (CPU + GPU kernels) without a GPU, to check that it builds.

    TORCH_CUDA_ARCH_LIST=9.0 python -m op_builder.compile_check amp_C [more ops]

Builds into a scratch directory (nothing enters the cache) and reports the time.
A JIT build without a visible GPU compiles only the CPU sources; this is how a
kernel author without a GPU keeps the CUDA sources compiling.
"""
import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from op_builder.errors import OpBuildError
from op_builder.jit import compile_module
from op_builder.registry import builder_for


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="+", help="op names, e.g. amp_C")
    args = parser.parse_args(argv)
    failed = 0
    for name in args.ops:
        builder = builder_for(name)
        with_gpu = builder.GROUP == "CUDA"
        build_dir = Path(tempfile.mkdtemp(prefix=f"apex-check-{name}-"))
        try:
            seconds = compile_module(builder, builder.fingerprint(with_gpu), build_dir,
                                     failed_log=Path(tempfile.gettempdir()) / f"apex-check-{name}.log")
            print(f"{name}: compiled ({'CPU + GPU' if with_gpu else 'CPU'}) in {seconds:.0f} s")
        except OpBuildError as error:
            print(error, file=sys.stderr)
            failed += 1
        finally:
            shutil.rmtree(build_dir, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
