"""Host cost of one fused LayerNorm / RMSNorm forward + backward, beside torch.

    python benchmarks/normalization/host_overhead_norms.py                  # CPU
    python benchmarks/normalization/host_overhead_norms.py --device cuda    # 1 GPU
    python benchmarks/normalization/host_overhead_norms.py --profile        # + cProfile of the apex rows

The input is tiny (4x64), so kernel time is negligible and a step costs what the host
spends around the kernels: Python, the dispatcher, autograd. Each row prints the median
and the fastest µs per step over several runs of back-to-back steps (the thread's CPU time
on CPU; wall time on CUDA, where the queue is drained once per run, not per step). On a
shared machine noise only ever adds time, so the fastest run is the steadier figure.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import statistics
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

ROWS, COLS = 4, 64  # small enough that kernels cost (next to) nothing


def make_cases(device: str, dtype: torch.dtype):
    """(name, forward(x) -> y, parameters) per row; apex rows next to their torch counterpart."""
    import apex.normalization as N

    def param(param_dtype=dtype):
        return torch.randn(COLS, device=device, dtype=param_dtype, requires_grad=True)

    def module(m):
        m = m.to(device=device, dtype=dtype)
        return m, list(m.parameters())

    w, b, rms_w, mixed_w, mixed_b = param(), param(), param(), param(torch.float32), param(torch.float32)
    return [
        ("apex FusedLayerNorm", *module(N.FusedLayerNorm(COLS))),
        ("torch nn.LayerNorm", *module(torch.nn.LayerNorm(COLS))),
        ("apex FusedRMSNorm", *module(N.FusedRMSNorm(COLS))),
        ("torch nn.RMSNorm", *module(torch.nn.RMSNorm(COLS))),
        ("apex fused_layer_norm_affine", lambda x: N.fused_layer_norm_affine(x, w, b, (COLS,), 1e-5), [w, b]),
        ("torch F.layer_norm", lambda x: F.layer_norm(x, (COLS,), w, b, 1e-5), [w, b]),
        ("apex fused_rms_norm_affine", lambda x: N.fused_rms_norm_affine(x, rms_w, (COLS,), 1e-5), [rms_w]),
        ("torch F.rms_norm", lambda x: F.rms_norm(x, (COLS,), rms_w, 1e-5), [rms_w]),
        ("apex fused_layer_norm (plain)", lambda x: N.fused_layer_norm(x, (COLS,), 1e-5), []),
        ("apex mixed_dtype_..._layer_norm_affine",
         lambda x: N.mixed_dtype_fused_layer_norm_affine(x, mixed_w, mixed_b, (COLS,), 1e-5), [mixed_w, mixed_b]),
        ("apex FusedLayerNorm memory_efficient", *module(N.FusedLayerNorm(COLS, memory_efficient=True))),
    ]


def make_step(fn, parameters, device: str, dtype: torch.dtype):
    x = torch.randn(ROWS, COLS, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(fn(x))  # the output's dtype (the mixed forms output float32)

    def step():
        x.grad = None
        for p in parameters:
            p.grad = None
        fn(x).backward(dy)

    return step


def measure(step, device: str, steps: int, repeats: int) -> tuple[float, float]:
    """(median, fastest) µs per step over `repeats` runs of `steps` back-to-back steps."""
    for _ in range(50):  # warm-up: op loading, caches, allocator
        step()
    clock = time.thread_time if device == "cpu" else time.perf_counter
    runs = []
    for _ in range(repeats):
        if device == "cuda":
            torch.cuda.synchronize()
        start = clock()
        for _ in range(steps):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
        runs.append((clock() - start) / steps * 1e6)
    return statistics.median(runs), min(runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--steps", type=int, default=1000, help="back-to-back steps per timed run")
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per row")
    parser.add_argument("--profile", action="store_true", help="cProfile the apex rows (top functions by tottime)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    print(f"norm fwd+bwd host cost, {args.device}, {args.dtype} {ROWS}x{COLS}, torch {torch.__version__}")
    print(f"{'case':<40} {'median us':>10} {'min us':>8}")
    for name, fn, parameters in make_cases(args.device, dtype):
        step = make_step(fn, parameters, args.device, dtype)
        median, fastest = measure(step, args.device, args.steps, args.repeats)
        print(f"{name:<40} {median:>10.1f} {fastest:>8.1f}", flush=True)
        if args.profile and name.startswith("apex"):
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [step() for _ in range(args.steps)])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(12)


if __name__ == "__main__":
    main()
