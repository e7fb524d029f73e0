"""Fused scaled (masked / causal) softmax (apex.transformer, the four scaled_*softmax_cuda modules)
beside torch eager and torch.compile of ``(x * scale).masked_fill(mask, -inf).softmax(-1)``.

Bytes that must move: forward reads the scores and writes the probabilities (the causal case
counts the whole input, as the anchors do, though the kernel skips the masked triangle), plus the
[b, 1, sq, sk] bool mask once; backward reads grad and probabilities and writes grad_input.
Cases: the issue's causal anchors, a padding-masked BERT-like shape, and 32K / 64K keys.

    python benchmarks/transformer/bench_softmax.py [--dtypes bf16 fp16 fp32] [--impls apex torch torch.compile]
"""
from __future__ import annotations

import torch

from harness import Case, main

SCALE = 0.125


def torch_softmax(x, mask):
    return (x * SCALE).masked_fill(mask, float("-inf")).softmax(-1)


def causal_case(batches: int, sq: int, dtype: torch.dtype) -> Case:
    from apex._ops import ops

    def inputs():
        x = torch.randn(batches, sq, sq, device="cuda", dtype=dtype)
        return x, torch.ones(sq, sq, dtype=torch.bool, device="cuda").triu(1)

    n = batches * sq * sq * torch.finfo(dtype).bits // 8
    return Case(f"causal {batches}x{sq}x{sq}", inputs,
                lambda x, mask: ops("fused_softmax").scaled_upper_triang_masked_softmax_forward(x, SCALE),
                torch_softmax, forward_bytes=2 * n, backward_bytes=3 * n)


def masked_case(b: int, heads: int, sq: int, sk: int, dtype: torch.dtype) -> Case:
    from apex._ops import ops

    def inputs():
        x = torch.randn(b, heads, sq, sk, device="cuda", dtype=dtype)
        return x, torch.rand(b, 1, sq, sk, device="cuda") < 0.1

    n = b * heads * sq * sk * torch.finfo(dtype).bits // 8
    return Case(f"masked {b}x{heads}x{sq}x{sk}", inputs,
                lambda x, mask: ops("fused_softmax").scaled_masked_softmax_forward(x, mask, SCALE),
                torch_softmax, forward_bytes=2 * n + b * sq * sk, backward_bytes=3 * n)


def cases(dtype: torch.dtype) -> list[Case]:
    return [
        causal_case(64, 2048, dtype),
        causal_case(16, 8192, dtype),
        masked_case(16, 16, 512, 512, dtype),
        masked_case(1, 8, 512, 32768, dtype),
        masked_case(1, 4, 256, 65536, dtype),
    ]


if __name__ == "__main__":
    main("bench_softmax.py", "scaled softmax", cases, __doc__)
