"""apex.mlp.MLP (ReLU) beside torch eager nn.Sequential(Linear, ReLU, Linear, ReLU, ...), torch.compile of
the same and the torch.matmul ceiling: GPT-class blocks hidden -> 4 hidden -> hidden (tokens x hidden,
bf16 and fp16), and NVIDIA apex's own L0 test MLP [480, 1024, 1024, 512, 256, 1] at batch 1024.

"fwd" times forward calls on inputs and parameters that require grad; "fwd+bwd" adds backward of a
given output gradient (parameter grads reset to None each call). Medians of batches of back-to-back
calls between CUDA events, the implementations and the ceiling (the pass's GEMMs as torch.matmul
calls) interleaved batch by batch against GPU clock drift (gemm_bench.interleaved_ms).

    python benchmarks/dense/bench_mlp.py [--dtypes bf16 fp16] [--quick] [--shapes 4096x1024 8192x4096 16384x8192]
"""
from __future__ import annotations

import copy
import sys
import time
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.dense.gemm_bench import DTYPES, GemmTable, free_memory, linear_gemms, module_passes, parse_args  # noqa: E402

SHAPES = ["4096x1024", "8192x4096", "16384x8192"]  # tokens x hidden
QUICK_SHAPES = ["8192x4096"]
UPSTREAM_SIZES, UPSTREAM_BATCH = [480, 1024, 1024, 512, 256, 1], 1024


def implementations(sizes: list[int], dtype: torch.dtype):
    """(apex MLP, the eager nn.Sequential with its parameters)."""
    from apex.mlp import MLP

    mlp = MLP(sizes, activation="relu")
    layers = []
    for i in range(mlp.num_layers):
        linear = nn.Linear(sizes[i], sizes[i + 1])
        with torch.no_grad():
            linear.weight.copy_(mlp.weights[i])
            linear.bias.copy_(mlp.biases[i])
        layers += [linear, nn.ReLU()]
    return mlp.to("cuda", dtype), nn.Sequential(*layers).to("cuda", dtype)


def main() -> None:
    args = parse_args(__doc__, "bench_mlp.py", SHAPES, QUICK_SHAPES, "tokens x hidden, e.g. 8192x4096")
    started = time.perf_counter()
    table = GemmTable("apex.mlp.MLP vs torch (GEMM-bound)")
    cases = [(UPSTREAM_BATCH, UPSTREAM_SIZES, "upstream L0 MLP")]
    for shape in args.shapes:
        tokens, hidden = (int(v) for v in shape.split("x"))
        cases.append((tokens, [hidden, 4 * hidden, hidden], f"MLP {shape}"))
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for tokens, sizes, name in cases:
            torch._dynamo.reset()  # a fresh compile per case (one code object would hit the recompile limit)
            mlp, eager = implementations(sizes, dtype)
            impls = {"apex": mlp, "torch eager": eager, "torch.compile": torch.compile(copy.deepcopy(eager))}
            x = torch.randn(tokens, sizes[0], device="cuda", dtype=dtype, requires_grad=True)
            grad = torch.randn(tokens, sizes[-1], device="cuda", dtype=dtype)
            passes = {impl: module_passes(module, x, grad) for impl, module in impls.items()}
            for pass_name in ("fwd", "fwd+bwd"):
                gemms = [g for i in range(len(sizes) - 1)
                         for g in linear_gemms(tokens, sizes[i], sizes[i + 1], backward=pass_name == "fwd+bwd")]
                table.time(f"{name} {dtype_name}", pass_name, {impl: calls[pass_name] for impl, calls in passes.items()},
                           gemms, dtype)
            del impls, passes, mlp, eager, x, grad
            free_memory()
    table.print(started)


if __name__ == "__main__":
    main()
