"""Host time of one optimizer step (Python, dispatcher, launches): apex's fused optimizers beside
torch.optim's foreach and fused ones, on 289 tensors (the GPT set's count, param_sets) of 128
elements each, so that the GPU work is a few microseconds and the host is what a step costs.

Timing: the wall time of 200 back-to-back step() calls (no synchronisation inside; the GPU keeps
up), per call, the fastest of 5 runs (on a shared machine noise only adds time; the CPU kernels'
threads, when a neighbour takes a core, can add milliseconds to a run: `--threads 1` avoids that); the device time per step (CUDA events) is printed beside it to
show the loop was host-bound. Also the same on CPU tensors (host time there includes the kernels).
"vs torch" is an apex row's time over the faster torch.optim row of its algorithm (CUDA host time
where a GPU is visible, else CPU).

    python benchmarks/optimizers/bench_step_host.py                  # CUDA and CPU columns
    python benchmarks/optimizers/bench_step_host.py --device cpu     # CPU only (runs without a GPU)
    python benchmarks/optimizers/bench_step_host.py --device cpu --threads 1   # steadier on a busy CPU
"""
from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parents[1]), str(HERE.parents[1] / "compatibility"), str(HERE)]

from apex import optimizers as apex_optim  # noqa: E402
from benchmarks.common import require_gpu  # noqa: E402
from param_sets import gpt_medium_shapes  # noqa: E402

STEPS, RUNS, ELEMENTS = 200, 5, 128
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
    ("Adagrad", "apex FusedAdagrad", lambda ps: apex_optim.FusedAdagrad(ps, lr=1e-2, weight_decay=0.1)),
    ("Adagrad", "torch foreach", lambda ps: torch.optim.Adagrad(ps, foreach=True, lr=1e-2, weight_decay=0.1)),
    ("Adagrad", "torch fused", lambda ps: torch.optim.Adagrad(ps, fused=True, lr=1e-2, weight_decay=0.1)),
    ("Adadelta", "apex FusedAdadelta", lambda ps: apex_optim.FusedAdadelta(ps, lr=1.0)),
    ("Adadelta", "torch foreach", lambda ps: torch.optim.Adadelta(ps, foreach=True, lr=1.0)),
    ("NovoGrad", "apex FusedNovoGrad", lambda ps: apex_optim.FusedNovoGrad(ps, lr=1e-3)),
    ("LARS", "apex FusedLARS", lambda ps: apex_optim.FusedLARS(ps, lr=1e-2, momentum=0.9)),
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
    fastest = walls.index(min(walls))
    return walls[fastest], devices[fastest] if devices else float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("all", "cpu"), default="all",
                        help="all: CUDA and CPU columns (needs a GPU); cpu: the CPU column alone")
    parser.add_argument("--threads", type=int, default=None, help="torch's CPU threads (default: torch's own)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    devices = ("cuda", "cpu") if args.device == "all" else ("cpu",)
    if "cuda" in devices:
        require_gpu(__file__)
    count = len(gpt_medium_shapes())
    print(f"## host time per step(), {count} tensors of {ELEMENTS} elements (float32)")
    header = (f"{'algorithm':<14} {'implementation':<18} {'cuda host us':>12} {'(device us)':>12} {'cpu host us':>12} "
              f"{'vs torch':>9}")
    print(header)
    print("-" * len(header))
    results = []  # (algorithm, implementation, cuda host, cuda device, cpu host)
    for algorithm, impl, make in CASES:
        row = {}
        for device in devices:
            params = [torch.randn(ELEMENTS, device=device).requires_grad_() for _ in range(count)]
            for param in params:
                param.grad = torch.randn_like(param) * 1e-3
            try:
                row[device] = host_us(make(params), device)
            except (RuntimeError, ValueError):  # e.g. a fused torch variant that does not take CPU tensors
                pass
        nan = (float("nan"), float("nan"))
        (cuda_host, cuda_device), (cpu_host, _) = row.get("cuda", nan), row.get("cpu", nan)
        results.append((algorithm, impl, cuda_host, cuda_device, cpu_host))
    compared = 2 if "cuda" in devices else 4  # the host time "vs torch" compares
    for algorithm, impl, cuda_host, cuda_device, cpu_host in results:
        torch_times = [r[compared] for r in results
                       if r[0] == algorithm and r[1].startswith("torch") and not math.isnan(r[compared])]
        ours = (cuda_host, cuda_device, cpu_host)[compared - 2]
        ratio = f"{ours / min(torch_times):>9.2f}" if impl.startswith("apex") and torch_times else f"{'':>9}"
        print(f"{algorithm:<14} {impl:<18} {cuda_host:>12.1f} {cuda_device:>12.1f} {cpu_host:>12.1f} {ratio}",
              flush=True)


if __name__ == "__main__":
    main()
