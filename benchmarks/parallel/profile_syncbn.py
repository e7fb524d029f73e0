"""Where a SyncBatchNorm step's time goes on one GPU, apex beside torch.

    python benchmarks/parallel/profile_syncbn.py              # fp16, NCHW and NHWC
    python benchmarks/parallel/profile_syncbn.py --dtype bf16

Per layout and implementation: the kernels of a few forward+backward steps by device
time (torch.profiler), then two step times. "synced" times each step alone, as
bench_syncbn.py does, so it includes the launch latency before the first kernel;
"pipelined" queues many steps back to back, so it is the device time per step, or the
host's time per step when the host cannot keep the GPU fed.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.common import time_ms  # noqa: E402
from benchmarks.parallel.bench_syncbn import DTYPES, LAYOUTS, make_case, training_step  # noqa: E402

PROFILED_STEPS = 5
PIPELINED_STEPS = 50


def pipelined_ms(step) -> float:
    step()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(PIPELINED_STEPS):
        step()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / PIPELINED_STEPS


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", choices=list(DTYPES), default="fp16")
    parser.add_argument("--rows", type=int, default=12, help="kernels listed per case")
    args = parser.parse_args()
    for layout, memory_format in LAYOUTS.items():
        x, dy, modules = make_case(DTYPES[args.dtype], memory_format)
        for impl, module in modules.items():
            step = training_step(module, x, dy)
            for _ in range(3):  # warm up (first use compiles and caches)
                step()
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(PROFILED_STEPS):
                    step()
                torch.cuda.synchronize()
            print(f"## {impl}, {args.dtype} {layout} {tuple(x.shape)}: {PROFILED_STEPS} steps", flush=True)
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.rows), flush=True)
            print(f"step ms: synced {time_ms(step, warmup=3, iters=20):.3f}, pipelined {pipelined_ms(step):.3f}\n",
                  flush=True)


if __name__ == "__main__":
    main()
