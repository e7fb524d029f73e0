"""Megatron's weight-gradient accumulation (fused_weight_gradient_mlp_cuda.wgrad_gemm_accum_fp32 /
_fp16: main_grad += d_output^T @ input) beside torch eager (``main_grad.add_(d_output.t() @ input)``,
Megatron's unfused path; ``main_grad.addmm_`` for a 16-bit main_grad), torch.compile of it, and the
ceiling: the GEMM ``d_output.t() @ input`` alone as one torch.matmul call. Shapes are GPT layers'
weight gradients (tokens x in_features x out_features), bf16 and fp16 inputs.

Medians of batches of back-to-back calls between CUDA events, the implementations and the ceiling
interleaved batch by batch against GPU clock drift (gemm_bench.interleaved_ms).

    python benchmarks/dense/bench_wgrad.py [--dtypes bf16 fp16] [--quick] [--shapes 8192x4096x16384 ...]
"""
from __future__ import annotations

import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "compatibility"))

from benchmarks.dense.gemm_bench import DTYPES, Gemm, GemmTable, free_memory, parse_args  # noqa: E402

SHAPES = ["4096x1024x4096", "8192x4096x16384", "16384x8192x8192"]  # tokens x in_features x out_features
QUICK_SHAPES = ["8192x4096x16384", "16384x8192x8192"]


def eager_fp32(x, dy, main_grad):
    main_grad.add_(torch.matmul(dy.t(), x))


def eager_16bit(x, dy, main_grad):
    main_grad.addmm_(dy.t(), x)


def main() -> None:
    args = parse_args(__doc__, "bench_wgrad.py", SHAPES, QUICK_SHAPES, "tokens x in x out, e.g. 8192x4096x16384")
    import fused_weight_gradient_mlp_cuda as wgrad

    started = time.perf_counter()
    table = GemmTable("wgrad accumulation vs torch (GEMM-bound)")
    for dtype_name in args.dtypes:
        dtype = DTYPES[dtype_name]
        for shape in args.shapes:
            tokens, in_features, out_features = (int(v) for v in shape.split("x"))
            x = torch.randn(tokens, in_features, device="cuda", dtype=dtype)
            dy = torch.randn(tokens, out_features, device="cuda", dtype=dtype)
            for main_dtype, fused, eager in ((torch.float32, wgrad.wgrad_gemm_accum_fp32, eager_fp32),
                                             (dtype, wgrad.wgrad_gemm_accum_fp16, eager_16bit)):
                torch._dynamo.reset()
                main_grad = torch.zeros(out_features, in_features, device="cuda", dtype=main_dtype)
                compiled = torch.compile(eager)
                calls = {"apex": lambda: fused(x, dy, main_grad), "torch eager": lambda: eager(x, dy, main_grad),
                         "torch.compile": lambda: compiled(x, dy, main_grad)}
                main_name = "fp32" if main_dtype == torch.float32 else dtype_name
                table.time(f"{shape} {dtype_name} main_grad {main_name}", "wgrad", calls,
                           [Gemm(out_features, in_features, tokens, a_transposed=True)], dtype)
                del main_grad, compiled, calls
            del x, dy
            free_memory()
    table.print(started, speedup_target=None, ceiling_target=95)


if __name__ == "__main__":
    main()
