"""Fused (bias-)SwiGLU (apex.transformer.functional.fused_bias_swiglu) beside torch eager and
torch.compile of ``F.silu(gate + b1) * (up + b2)`` over a gate/up tensor [rows, 2H].

Bytes that must move: forward reads x [rows, 2H] and writes y [rows, H]; backward reads grad_y and
x and writes grad_x (the bias gradient, summed in the same pass, is O(H)). Cases: the issue's
Liger anchors (no bias) and Llama-class shapes with bias (H = 14336, 28672).

    python benchmarks/transformer/bench_swiglu.py [--dtypes bf16 fp16 fp32] [--impls apex torch torch.compile]
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from harness import Case, main


def torch_swiglu(x, bias=None):
    if bias is not None:
        x = x + bias
    gate, up = x.chunk(2, dim=-1)
    return F.silu(gate) * up


def swiglu_case(rows: int, half: int, with_bias: bool, dtype: torch.dtype) -> Case:
    from apex.transformer.functional import fused_bias_swiglu

    def inputs():
        x = torch.randn(rows, 2 * half, device="cuda", dtype=dtype)
        return (x, torch.randn(2 * half, device="cuda", dtype=dtype)) if with_bias else (x,)

    n = rows * half * torch.finfo(dtype).bits // 8
    return Case(f"{'bias-' if with_bias else ''}swiglu {rows}x(2x{half})", inputs, fused_bias_swiglu, torch_swiglu,
                forward_bytes=3 * n, backward_bytes=5 * n, differentiable=2 if with_bias else 1)


def cases(dtype: torch.dtype) -> list[Case]:
    return [
        swiglu_case(8192, 14336, False, dtype),
        swiglu_case(16384, 4096, False, dtype),
        swiglu_case(8192, 14336, True, dtype),
        swiglu_case(4096, 28672, True, dtype),
    ]


if __name__ == "__main__":
    main("bench_swiglu.py", "SwiGLU", cases, __doc__)
