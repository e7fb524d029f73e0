"""Host cost of one fused LayerNorm / RMSNorm call, beside torch's: forward (no grad) and forward + backward.

    python benchmarks/normalization/host_overhead_norms.py                  # CPU
    python benchmarks/normalization/host_overhead_norms.py --device cuda    # 1 GPU
    python benchmarks/normalization/host_overhead_norms.py --profile        # + cProfile of the apex rows

The input is tiny (4x64), so kernel time is negligible and a call costs what the host
spends around the kernels: Python, the dispatcher, autograd. Each apex row is printed
beside its torch counterpart: the fastest µs per call over several runs of back-to-back
calls (the thread's CPU time on CPU; wall time on CUDA, where the queue is drained once
per run, not per call), and apex / torch. On a shared machine noise only ever adds time,
so the fastest run is the steadier figure; the rows take turns, so a busy neighbour slows
them alike.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from benchmarks.common import require_gpu  # noqa: E402
from benchmarks.parallel.host_overhead_syncbn import time_steps  # noqa: E402

ROWS, COLS = 4, 64  # small enough that kernels cost (next to) nothing


def make_cases(device: str, dtype: torch.dtype):
    """(apex name, forward, parameters, torch name, forward, parameters) per row: the same norm twice."""
    import apex.normalization as N
    from apex.contrib.layer_norm import FastLayerNorm

    def param(param_dtype=dtype):
        return torch.randn(COLS, device=device, dtype=param_dtype, requires_grad=True)

    def module(m):
        m = m.to(device=device, dtype=dtype)
        return m, list(m.parameters())

    w, b, rms_w, mixed_w, mixed_b = param(), param(), param(), param(torch.float32), param(torch.float32)
    layer_norm, rms_norm = module(torch.nn.LayerNorm(COLS)), module(torch.nn.RMSNorm(COLS))
    return [
        ("FusedLayerNorm", *module(N.FusedLayerNorm(COLS)), "nn.LayerNorm", *layer_norm),
        ("FusedRMSNorm", *module(N.FusedRMSNorm(COLS)), "nn.RMSNorm", *rms_norm),
        ("FastLayerNorm", *module(FastLayerNorm(COLS)), "nn.LayerNorm", *layer_norm),
        ("FusedLayerNorm memory_efficient", *module(N.FusedLayerNorm(COLS, memory_efficient=True)),
         "nn.LayerNorm", *layer_norm),
        ("fused_layer_norm_affine", lambda x: N.fused_layer_norm_affine(x, w, b, (COLS,), 1e-5), [w, b],
         "F.layer_norm", lambda x: F.layer_norm(x, (COLS,), w, b, 1e-5), [w, b]),
        ("fused_rms_norm_affine", lambda x: N.fused_rms_norm_affine(x, rms_w, (COLS,), 1e-5), [rms_w],
         "F.rms_norm", lambda x: F.rms_norm(x, (COLS,), rms_w, 1e-5), [rms_w]),
        ("fused_layer_norm (plain)", lambda x: N.fused_layer_norm(x, (COLS,), 1e-5), [],
         "F.layer_norm (plain)", lambda x: F.layer_norm(x, (COLS,), None, None, 1e-5), []),
        ("mixed_dtype_..._layer_norm_affine",
         lambda x: N.mixed_dtype_fused_layer_norm_affine(x, mixed_w, mixed_b, (COLS,), 1e-5), [mixed_w, mixed_b],
         "F.layer_norm", lambda x: F.layer_norm(x, (COLS,), w, b, 1e-5), [w, b]),
    ]


def make_steps(fn, parameters, device: str, dtype: torch.dtype):
    """(forward without grad, forward + backward) of one call on a fresh input."""
    x = torch.randn(ROWS, COLS, device=device, dtype=dtype, requires_grad=True)
    dy = torch.randn_like(fn(x))  # the output's dtype (the mixed forms output float32)

    def forward():
        with torch.no_grad():
            fn(x)

    def forward_backward():
        x.grad = None
        for p in parameters:
            p.grad = None
        fn(x).backward(dy)

    return forward, forward_backward


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=("cpu", "cuda"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    parser.add_argument("--steps", type=int, default=500, help="back-to-back calls per timed run")
    parser.add_argument("--repeats", type=int, default=9, help="timed runs per row (the fastest is printed)")
    parser.add_argument("--profile", action="store_true", help="cProfile the apex rows (top functions by tottime)")
    args = parser.parse_args()
    if args.device == "cuda":
        require_gpu(__file__)
    torch.set_num_threads(1)
    dtype = getattr(torch, args.dtype)
    cases = make_cases(args.device, dtype)
    steps = {}  # (row, side) -> (forward, forward_backward)
    for i, (_, apex_fn, apex_params, _, torch_fn, torch_params) in enumerate(cases):
        steps[i, "apex"] = make_steps(apex_fn, apex_params, args.device, dtype)
        steps[i, "torch"] = make_steps(torch_fn, torch_params, args.device, dtype)
    for pair in steps.values():  # warm-up: op loading, caches, allocator
        for step in pair:
            for _ in range(50):
                step()
    best = {(key, kind): float("inf") for key in steps for kind in (0, 1)}
    for _ in range(args.repeats):
        for key, pair in steps.items():
            for kind, step in enumerate(pair):
                best[key, kind] = min(best[key, kind], time_steps(step, args.device, args.steps))
    print(f"norm host cost per call, {args.device}, {args.dtype} {ROWS}x{COLS}, torch {torch.__version__} "
          f"(fastest of {args.repeats} runs of {args.steps} calls)")
    header = (f"{'apex':<34} {'torch':<22} {'fwd us':>7} {'torch':>7} {'ratio':>6} "
              f"{'fwd+bwd us':>11} {'torch':>7} {'ratio':>6}")
    print(header)
    print("-" * len(header))
    for i, (apex_name, _, _, torch_name, _, _) in enumerate(cases):
        cells = []
        for kind in (0, 1):
            ours, theirs = best[(i, "apex"), kind], best[(i, "torch"), kind]
            cells.append(f"{ours:>{7 if kind == 0 else 11}.1f} {theirs:>7.1f} {ours / theirs:>6.2f}")
        print(f"{apex_name:<34} {torch_name:<22} {cells[0]} {cells[1]}", flush=True)
    if args.profile:
        for i, (apex_name, *_rest) in enumerate(cases):
            print(f"\n## cProfile: {apex_name} forward+backward")
            profiler = cProfile.Profile()
            profiler.runcall(lambda: [steps[i, "apex"][1]() for _ in range(args.steps)])
            pstats.Stats(profiler).sort_stats("tottime").print_stats(8)


if __name__ == "__main__":
    main()
