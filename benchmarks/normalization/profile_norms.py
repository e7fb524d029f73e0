"""The kernels of one fused-norm forward+backward, with their launch shapes and occupancy.

    python benchmarks/normalization/profile_norms.py                      # layer bf16 4096x16384
    python benchmarks/normalization/profile_norms.py --kind rms --dtype fp32 --shape 32768 1024

Per kernel (torch.profiler's trace): mean device time, grid and block, registers per thread,
shared memory per block, the profiler's estimate of resident warps per SM, and, for the
kernels that move the data (forward: 2·N·H elements, backward: 3·N·H), that time as % of the
copy bandwidth measured in the same run. What bench_norms.py reports in one number, split
into the launches behind it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apex.normalization import FusedLayerNorm, FusedRMSNorm  # noqa: E402
from benchmarks.common import copy_bandwidth_gbs  # noqa: E402
from benchmarks.normalization.bench_norms import DTYPES  # noqa: E402

PROFILED_STEPS = 10
# Trace fields shown per kernel, and their column titles.
FIELDS = {"grid": "grid", "block": "block", "registers per thread": "regs", "shared memory": "smem",
          "warps per SM": "warps/SM"}
# Kernels that move the data, by a part of their name, and the N·H elements each moves.
ELEMENTS_MOVED = {"forward": 2, "backward_in_registers": 3, "backward_streaming": 3}


def kernel_events(step, steps: int) -> list[dict]:
    """The GPU kernel events of `steps` calls of step(), from torch.profiler's chrome trace."""
    for _ in range(3):  # warm up: first use builds and caches
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA], acc_events=True) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    with tempfile.NamedTemporaryFile(suffix=".json") as trace:
        prof.export_chrome_trace(trace.name)
        events = json.load(open(trace.name))["traceEvents"]
    return [e for e in events if e.get("cat") == "kernel"]


def short_name(name: str) -> str:
    """A kernel's name without return type, namespaces and argument list; template arguments kept."""
    name = name.removeprefix("void ").replace("(anonymous namespace)::", "")
    name = name[: name.rindex("(")] if name.endswith(")") else name
    return name.replace("apex::layer_norm::", "").replace("c10::", "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kind", choices=["layer", "rms"], default="layer")
    parser.add_argument("--dtype", choices=list(DTYPES), default="bf16")
    parser.add_argument("--shape", type=int, nargs=2, default=[4096, 16384], metavar=("ROWS", "COLS"))
    args = parser.parse_args()
    rows, cols = args.shape
    dtype = DTYPES[args.dtype]
    module = (FusedLayerNorm if args.kind == "layer" else FusedRMSNorm)(cols).cuda().to(dtype)
    x = torch.randn(rows, cols, device="cuda", dtype=dtype, requires_grad=True)
    dy = torch.randn_like(x)

    def step():
        x.grad = None
        module(x).backward(dy)

    copy_gbs = copy_bandwidth_gbs()
    by_name = defaultdict(list)
    for event in kernel_events(step, PROFILED_STEPS):
        by_name[short_name(event["name"])].append(event)
    element_bytes = x.element_size()
    print(f"## {args.kind} norm {args.dtype} {rows}x{cols}, fwd+bwd, {PROFILED_STEPS} steps "
          f"(copy bandwidth {copy_gbs:.0f} GB/s)")
    for name, events in sorted(by_name.items(), key=lambda item: -sum(e["dur"] for e in item[1])):
        mean_us = sum(e["dur"] for e in events) / len(events)
        shape = "  ".join(f"{title}={events[0]['args'].get(field)}" for field, title in FIELDS.items())
        passes = next((n for key, n in ELEMENTS_MOVED.items() if key in name), None)
        share = ""
        if passes:
            share = f"  {passes * rows * cols * element_bytes / (mean_us * 1e3) / copy_gbs * 100:.1f}% copy"
        print(f"{mean_us:9.1f} us  x{len(events) // PROFILED_STEPS}  {name[:110]}\n"
              f"             {shape}{share}")


if __name__ == "__main__":
    main()
