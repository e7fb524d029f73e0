"""Host time of one optimizer step (Python, dispatcher, launches): apex's fused optimizers beside
torch.optim's foreach and fused ones, on 289 tensors (the GPT set's count, param_sets) of 128
elements each, so that the GPU work is a few microseconds and the host is what a step costs.

Timing: the wall time of 200 back-to-back step() calls (no synchronisation inside; the GPU keeps
up), per call, median of 3 runs; the device time per step (CUDA events) is printed beside it to
show the loop was host-bound. Also the same on CPU tensors (host time there includes the kernels).

    python benchmarks/optimizers/bench_step_host.py
"""
from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "compatibility"), str(HERE)]

from apex import optimizers as apex_optim  # noqa: E402
from benchmarks.common import require_gpu  # noqa: E402
from param_sets import gpt_medium_shapes  # noqa: E402

STEPS, RUNS, ELEMENTS = 200, 3, 128
ADAM = dict(lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
SGD = dict(lr=1e-2, momentum=0.9)

CASES = [
    ("AdamW", "apex FusedAdam", lambda ps: apex_optim.FusedAdam(ps, **ADAM)),
    ("AdamW", "torch foreach", lambda ps: torch.optim.AdamW(ps, foreach=True, **ADAM)),
    ("AdamW", "torch fused", lambda ps: torch.optim.AdamW(ps, fused=True, **ADAM)),
    ("SGD momentum", "apex FusedSGD", lambda ps: apex_optim.FusedSGD(ps, **SGD)),
    ("SGD momentum", "torch foreach", lambda ps: torch.optim.SGD(ps, foreach=True, **SGD)),
    ("SGD momentum", "torch fused", lambda ps: torch.optim.SGD(ps, fused=True, **SGD)),
    ("LAMB", "apex FusedLAMB", lambda ps: apex_optim.FusedLAMB(ps, **ADAM)),
    ("RMSprop", "apex FusedRMSprop", lambda ps: apex_optim.FusedRMSprop(ps, lr=1e-4, momentum=0.9)),
    ("RMSprop", "torch foreach", lambda ps: torch.optim.RMSprop(ps, foreach=True, lr=1e-4, momentum=0.9)),
    ("AdamP", "apex FusedAdamP", lambda ps: apex_optim.FusedAdamP(ps, lr=1e-4)),
]


def host_us(optimizer: torch.optim.Optimizer, device: str) -> tuple[float, float]:
    """(host us per step, device us per step)."""
    for _ in range(5):
        optimizer.step()
    walls, devices = [], []
    for _ in range(RUNS):
        if device == "cuda":
            torch.cuda.synchronize()
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        t0 = time.perf_counter()
        for _ in range(STEPS):
            optimizer.step()
        walls.append((time.perf_counter() - t0) / STEPS * 1e6)
        if device == "cuda":
            stop.record()
            stop.synchronize()
            devices.append(start.elapsed_time(stop) / STEPS * 1e3)
    return statistics.median(walls), statistics.median(devices) if devices else float("nan")


def main() -> None:
    require_gpu(__file__)
    count = len(gpt_medium_shapes())
    print(f"## host time per step(), {count} tensors of {ELEMENTS} elements (float32)")
    header = f"{'algorithm':<14} {'implementation':<18} {'cuda host us':>12} {'(device us)':>12} {'cpu host us':>12}"
    print(header)
    print("-" * len(header))
    for algorithm, impl, make in CASES:
        row = []
        for device in ("cuda", "cpu"):
            params = [torch.randn(ELEMENTS, device=device).requires_grad_() for _ in range(count)]
            for param in params:
                param.grad = torch.randn_like(param) * 1e-3
            try:
                row.append(host_us(make(params), device))
            except (RuntimeError, ValueError):  # e.g. a fused torch variant that does not take CPU tensors
                row.append((float("nan"), float("nan")))
        (cuda_host, cuda_device), (cpu_host, _) = row
        print(f"{algorithm:<14} {impl:<18} {cuda_host:>12.1f} {cuda_device:>12.1f} {cpu_host:>12.1f}", flush=True)


if __name__ == "__main__":
    main()
