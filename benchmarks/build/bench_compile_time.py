"""Cold JIT build time of every op (or the ones named), each in a fresh cache, one after another.

    python benchmarks/build/bench_compile_time.py [OP ...] [--jobs N] [--pch on|off]

Each op is built by a fresh Python process that imports torch and calls apex's loader with an
empty cache, so the time is what a user waits on first use: the wall time of the build itself
(from the cache entry's metadata) and, from ninja's log, the slowest translation units. With a
GPU visible the CUDA kernels are built for the visible GPUs' archs (TORCH_CUDA_ARCH_LIST
overrides); without one only the C++ sources. A trivial torch extension (one C++ function through
torch.utils.cpp_extension.load_inline) is timed the same way first: the yardstick the op builds
are held to. Results in NOTES.md beside this file.

--pch on (the default, as JIT builds do): torch's precompiled headers and the Python entry's object
(op_builder/python_entry.py) are built once first (their time on a line of its own), and each op's
empty cache starts with them, as every op after a user's first finds them; --pch off: APEX_PCH=0,
every unit parses torch's headers (the object is still built once first).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

TRIVIAL = """
import os, sys, time, torch
from torch.utils.cpp_extension import load_inline
os.makedirs(sys.argv[1], exist_ok=True)  # load_inline writes its sources there and does not create it
start = time.monotonic()
load_inline(name="apex_trivial_extension", cpp_sources="at::Tensor twice(at::Tensor x) { return x * 2; }",
            functions=["twice"], build_directory=sys.argv[1])
print(time.monotonic() - start)
"""

BUILD_ONE = """
import sys, time, torch
from apex._ops import ops
start = time.monotonic()
ops(sys.argv[1])
print(time.monotonic() - start)
"""


# Precompiles the torch headers that op argv[1]'s build would use into the (empty) cache, and
# compiles the Python entry's object that every op links (--pch off: the object only).
PRECOMPILE = """
import sys, time, torch
from concurrent.futures import ThreadPoolExecutor
from apex.op_builder.plan import Purpose, plan_build
from apex.op_builder.precompiled_cache import JitHeaders
from apex.op_builder.precompiled_header import plan_header
from apex.op_builder.python_entry import plan_object
from apex.op_builder.registry import builder_for
builder = builder_for(sys.argv[1])
plan = plan_build(builder, Purpose.JIT)
header, obj = plan_header(plan), plan_object(plan)
shared = JitHeaders(builder.source_root)
start = time.monotonic()
with ThreadPoolExecutor(max_workers=1) as beside:  # side by side, as an op's first build does them
    gch = beside.submit(shared.gch_for, header) if sys.argv[2] == "on" and header is not None else None
    assert obj is not None and shared.object_for(obj) is not None, "no Python entry object"
    assert sys.argv[2] != "on" or (gch is not None and gch.result() is not None), "no precompiled header"
print(time.monotonic() - start)
"""


def _run(code: str, *args: str, env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", code, *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"build failed ({args}):\n{out.stderr[-3000:]}")
    return float(out.stdout.strip().splitlines()[-1])


def _compile_steps(cache: Path) -> list[tuple[float, float, str]]:
    """(start s, end s, output file) of every compile step, from the ninja log of the op's cache entry."""
    rows = []
    for log in cache.rglob(".ninja_log"):
        for line in log.read_text().splitlines()[1:]:
            start, end, _, output, _ = line.split("\t")
            rows.append((int(start) / 1000, int(end) / 1000, Path(output).name))
    return rows


def _slowest_units(cache: Path, count: int) -> str:
    """'file seconds' of the slowest compile steps."""
    slowest = sorted(((end - start, name) for start, end, name in _compile_steps(cache)), reverse=True)
    return ", ".join(f"{name} {seconds:.1f}" for seconds, name in slowest[:count])


def _timeline(cache: Path) -> str:
    """Every compile step as 'start-end file' in seconds from the build's first step, in start order:
    how ninja's jobs were filled (a long unit started late stretches the build past its own time)."""
    return "\n".join(f"    {start:6.1f}-{end:6.1f}  {name}" for start, end, name in sorted(_compile_steps(cache)))


def main() -> int:
    from apex.op_builder import all_builders

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("ops", nargs="*", help="op names (default: all)")
    parser.add_argument("--jobs", type=int, default=os.cpu_count(), help="MAX_JOBS for ninja (default: all cores)")
    parser.add_argument("--pch", choices=("on", "off"), default="on",
                        help="on: torch's precompiled headers built once first, as after a user's first op "
                             "(default); off: APEX_PCH=0")
    parser.add_argument("--units", type=int, default=3, help="how many of each op's slowest units to show")
    parser.add_argument("--timeline", action="store_true", help="also print every unit's start and end")
    args = parser.parse_args()
    names = args.ops or list(all_builders())
    env = dict(os.environ, MAX_JOBS=str(args.jobs), APEX_PCH="1" if args.pch == "on" else "0",
               PYTHONPATH=os.pathsep.join([str(REPO), str(REPO / "compatibility")]))
    import torch

    target = "GPU " + (os.environ.get("TORCH_CUDA_ARCH_LIST") or "visible archs") if torch.cuda.is_available() else "CPU only"
    print(f"# cold JIT builds, {os.cpu_count()} cores, MAX_JOBS={args.jobs}, {target}, torch {torch.__version__}, "
          f"precompiled torch headers {args.pch}")
    with tempfile.TemporaryDirectory() as scratch:
        trivial = _run(TRIVIAL, str(Path(scratch) / "trivial"), env=env)
        print(f"{'op':<36} {'seconds':>8} {'x trivial':>9}  slowest units (s)")
        print(f"{'(trivial torch extension)':<36} {trivial:>8.1f} {1.0:>9.2f}")
        shared = Path(scratch) / "cache-shared"
        shared.mkdir(mode=0o700)
        seconds = _run(PRECOMPILE, names[0], args.pch, env=dict(env, APEX_CACHE_DIR=str(shared)))
        what = "precompiled torch headers + Python entry" if args.pch == "on" else "Python entry"
        print(f"{f'({what}, once)':<36} {seconds:>8.1f} {seconds / trivial:>9.2f}", flush=True)
        for name in names:
            cache = Path(scratch) / f"cache-{name}"
            shutil.copytree(shared, cache, copy_function=os.link)  # linked, not copied: ~450 MB
            seconds = _run(BUILD_ONE, name, env=dict(env, APEX_CACHE_DIR=str(cache)))
            print(f"{name:<36} {seconds:>8.1f} {seconds / trivial:>9.2f}  {_slowest_units(cache, args.units)}",
                  flush=True)
            if args.timeline:
                print(_timeline(cache), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
