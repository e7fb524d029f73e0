"""Fused LayerNorm / RMSNorm (apex.normalization) beside F.layer_norm / F.rms_norm and
torch.compile of them, forward and forward+backward, bf16 and fp32.

Bytes that must move: forward reads x and writes y (2·N·H elements); forward+backward
adds reading dy and x (or y) and writing dx (5·N·H). Parameter traffic is O(H), ignored.

Times are device times by default: several calls are captured in one CUDA graph and
replayed, so host overhead (Python, dispatcher, autograd bookkeeping) is left out for every
implementation alike. ``--eager`` times plain eager calls back to back instead: batches of
EAGER_CALLS calls between two CUDA events, one sync per batch, so a call that costs the host
more than the GPU shows up as lost bandwidth (the training-loop case).

"apex FastLayerNorm" is apex.contrib.layer_norm's module (the same kernels as FusedLayerNorm).

    python benchmarks/normalization/bench_norms.py [--kinds layer rms] [--dtypes bf16 fp32] [--impls apex torch torch.compile] [--eager]
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from apex.contrib.layer_norm import FastLayerNorm  # noqa: E402
from apex.normalization import FusedLayerNorm, FusedRMSNorm  # noqa: E402
from benchmarks.common import BandwidthTable, copy_bandwidth_gbs, require_gpu, time_ms  # noqa: E402

SHAPES = [(16384, 4096), (32768, 1024), (4096, 16384), (8192, 8192), (8192, 5120)]
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
EPS = 1e-5
IMPLS = ["apex", "apex FastLayerNorm", "torch", "torch.compile"]


# Calls per captured graph: enough that the graph launch itself is negligible.
CALLS_PER_GRAPH = 10


def device_time_ms(fn) -> float:
    """Device time of one fn() call, from replays of a CUDA graph holding CALLS_PER_GRAPH calls."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up (and any compilation) outside the capture
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            fn()
    ms = time_ms(graph.replay, warmup=3, iters=20) / CALLS_PER_GRAPH
    del graph
    return ms


# Eager calls per timed batch: enough that the batch's first launch latency is negligible.
EAGER_CALLS = 20


def eager_time_ms(fn) -> float:
    """Time per call of EAGER_CALLS back-to-back eager calls (host included): one timed batch per sample."""
    return time_ms(lambda: [fn() for _ in range(EAGER_CALLS)], warmup=3, iters=15) / EAGER_CALLS


def implementations(kind: str, hidden: int, dtype: torch.dtype):
    """(name -> callable x -> y, shared parameters): every implementation uses the same weight/bias."""
    # A fresh dynamo cache per case: every case re-defines `eager` (one code object), which would
    # otherwise exhaust dynamo's recompile limit and silently fall back to eager mode.
    torch._dynamo.reset()
    fused = (FusedLayerNorm if kind == "layer" else FusedRMSNorm)(hidden, eps=EPS).to("cuda", dtype)
    with torch.no_grad():
        for p in fused.parameters():
            p.normal_()
    if kind == "layer":
        def eager(x):
            return F.layer_norm(x, (hidden,), fused.weight, fused.bias, EPS)
    else:
        def eager(x):
            return F.rms_norm(x, (hidden,), fused.weight, EPS)
    impls = {"apex": fused, "torch": eager, "torch.compile": torch.compile(eager)}
    if kind == "layer":
        fast = FastLayerNorm(hidden, eps=EPS).to("cuda", dtype)
        fast.weight, fast.bias = fused.weight, fused.bias  # the same parameters
        impls["apex FastLayerNorm"] = fast
    return impls, list(fused.parameters())


def bench(kind: str, dtype_name: str, copy_gbs: float, only: list[str], eager: bool) -> BandwidthTable:
    dtype = DTYPES[dtype_name]
    timing = f"eager, {EAGER_CALLS} calls back to back" if eager else "device time, CUDA graph replay"
    table = BandwidthTable(f"{kind} norm, {dtype_name}, {timing}", copy_gbs)
    measure = eager_time_ms if eager else device_time_ms
    for rows, hidden in SHAPES:
        x = torch.randn(rows, hidden, device="cuda", dtype=dtype)
        x_grad = x.detach().requires_grad_()
        dy = torch.randn_like(x)
        nbytes = rows * hidden * x.element_size()
        impls, params = implementations(kind, hidden, dtype)
        for name, fn in impls.items():
            if name not in only:
                continue

            def forward():
                with torch.no_grad():
                    fn(x)

            def forward_backward():
                # autograd.grad, not .backward(): no accumulation into .grad in the timing.
                torch.autograd.grad(fn(x_grad), [x_grad, *params], dy)

            table.add(f"{rows}x{hidden} fwd", name, measure(forward), 2 * nbytes)
            table.add(f"{rows}x{hidden} fwd+bwd", name, measure(forward_backward), 5 * nbytes)
        del x, x_grad, dy
    return table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kinds", nargs="+", default=["layer", "rms"], choices=["layer", "rms"])
    parser.add_argument("--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument("--impls", nargs="+", default=IMPLS, choices=IMPLS)
    parser.add_argument("--eager", action="store_true", help="time back-to-back eager calls (host overhead included)")
    args = parser.parse_args(argv)
    require_gpu(__file__)
    copy_gbs = copy_bandwidth_gbs()
    for kind in args.kinds:
        for dtype_name in args.dtypes:
            bench(kind, dtype_name, copy_gbs, args.impls, args.eager).print()


if __name__ == "__main__":
    main()
