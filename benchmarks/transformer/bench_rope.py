"""Fused rotary positional embedding (apex.transformer.functional.fused_apply_rotary_pos_emb) beside
torch eager and torch.compile of Megatron's unfused ``t * cos + rotate_half(t) * sin``.

Bytes that must move: forward reads t and writes the output, backward reads the gradient and writes
grad_t; the float32 angle table is read once per pass. Cases: the issue's sbhd anchor and
Llama-class shapes (d = 128, 8 to 64 heads, 4K to 32K tokens, bshd), one with half the dims rotated.

    python benchmarks/transformer/bench_rope.py [--dtypes bf16 fp16 fp32] [--impls apex torch torch.compile]
"""
from __future__ import annotations

import torch

from harness import Case, main


def torch_rope(t, freqs, tensor_format="sbhd"):
    if tensor_format == "bshd":
        freqs = freqs.transpose(0, 1)
    d2 = freqs.shape[-1]
    rot, rest = t[..., :d2], t[..., d2:]
    x1, x2 = rot.chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    out = rot * freqs.cos().to(t.dtype) + rotated * freqs.sin().to(t.dtype)
    return torch.cat((out, rest), dim=-1) if rest.shape[-1] else out


def rope_case(label: str, shape: tuple, rotary: int, tensor_format: str, dtype: torch.dtype) -> Case:
    from apex.transformer.functional import fused_apply_rotary_pos_emb

    s = shape[0] if tensor_format == "sbhd" else shape[1]

    def inputs():
        return (torch.randn(shape, device="cuda", dtype=dtype), torch.randn(s, 1, 1, rotary, device="cuda"))

    n = torch.Size(shape).numel() * torch.finfo(dtype).bits // 8
    table = s * rotary * 4
    return Case(f"{label} {'x'.join(map(str, shape))}{'' if rotary == shape[-1] else f' rot{rotary}'}", inputs,
                lambda t, freqs: fused_apply_rotary_pos_emb(t, freqs, tensor_format=tensor_format),
                lambda t, freqs: torch_rope(t, freqs, tensor_format),
                forward_bytes=2 * n + table, backward_bytes=2 * n + table)


def cases(dtype: torch.dtype) -> list[Case]:
    return [
        rope_case("sbhd", (4096, 2, 32, 128), 128, "sbhd", dtype),
        rope_case("bshd", (1, 8192, 32, 128), 128, "bshd", dtype),
        rope_case("bshd", (1, 32768, 8, 128), 128, "bshd", dtype),
        rope_case("bshd", (2, 4096, 64, 128), 128, "bshd", dtype),
        rope_case("bshd", (2, 4096, 32, 128), 64, "bshd", dtype),
    ]


if __name__ == "__main__":
    main("bench_rope.py", "RoPE", cases, __doc__)
