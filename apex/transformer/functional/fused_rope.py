"""Fused rotary positional embedding (RoPE), as Megatron-core and NeMo call it (NVIDIA/ROCm apex's
``apex.transformer.functional.fused_rope``), over the ``fused_rotary_positional_embedding`` ops.

The ops are differentiable in t, in C++ (nothing runs in Python per call, eager or compiled). Beyond
upstream: ``tensor_format="bshd"`` (no copies either way), ``interleaved=True`` (GPT-J pairs
(2i, 2i+1) instead of GPT-NeoX halves), per-sequence ``start_positions`` (offsets into the table,
e.g. for decoding with a KV cache; the table needs ``max(start) + s`` rows), rotary dims below the
head dim, and tables (``freqs`` or ``cos``/``sin``) in float32 or the input's dtype. 16-bit inputs
are rotated with the same roundings as the unfused ``t * cos + rotate_half(t) * sin`` in that
dtype, so fused and unfused agree exactly. Tables get no gradient (as upstream).
"""
from __future__ import annotations

from typing import Optional

import torch

from apex._ops import ops

__all__ = [
    "fused_apply_rotary_pos_emb", "fused_apply_rotary_pos_emb_cached", "fused_apply_rotary_pos_emb_thd",
    "fused_apply_rotary_pos_emb_2d",
]

_LIBRARY = "fused_rotary_positional_embedding"

# ROCm apex's switch to its aiter backend (its tests read it): these kernels are apex's own.
AITER_ROPE_BACKEND = False


def _as_sbhd(t: torch.Tensor, tensor_format: str) -> torch.Tensor:
    if tensor_format == "sbhd":
        return t
    if tensor_format == "bshd":
        return t.transpose(0, 1)
    raise ValueError(f"tensor_format must be 'sbhd' or 'bshd', got {tensor_format!r}")


def _rope_sbhd(op, t, tables, transpose_output_memory, tensor_format, interleaved, start_positions):
    """Runs an sbhd op on t in either format: a bshd tensor is its sbhd transpose, and its output is
    laid out bshd (the op's transpose_output) unless transpose_output_memory asks otherwise."""
    bshd = tensor_format == "bshd"
    out = op(_as_sbhd(t, tensor_format), *tables, transpose_output_memory != bshd, interleaved=interleaved,
             start_positions=start_positions)
    return out.transpose(0, 1) if bshd else out


def fused_apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, transpose_output_memory: bool = False, *,
                               tensor_format: str = "sbhd", interleaved: bool = False,
                               start_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """RoPE of t with angles ``freqs``.

    Args:
        t: [s, b, h, d] (``tensor_format="sbhd"``) or [b, s, h, d] ("bshd"); float32 / float16 /
            bfloat16, any strides.
        freqs: [>= s, 1, 1, d2] angles (d2 <= d, even; dims past d2 are passed through), float32 or t's dtype.
        transpose_output_memory: lay the output out with s and b swapped in memory (so that
            ``out.transpose(0, 1)`` is contiguous).
        interleaved: rotate pairs (2i, 2i+1) instead of (i, i + d2/2).
        start_positions: int [b]: sequence j starts at position start_positions[j] of the table.
    Returns:
        t's shape and dtype.
    """
    return _rope_sbhd(ops(_LIBRARY).fused_rope_forward, t, (freqs,), transpose_output_memory, tensor_format,
                      interleaved, start_positions)


def fused_apply_rotary_pos_emb_cached(t: torch.Tensor, cos_: torch.Tensor, sin_: torch.Tensor,
                                      transpose_output_memory: bool = False, *, tensor_format: str = "sbhd",
                                      interleaved: bool = False,
                                      start_positions: Optional[torch.Tensor] = None) -> torch.Tensor:
    """fused_apply_rotary_pos_emb with precomputed ``cos_``, ``sin_`` [>= s, 1, 1, d2] (float32 or t's dtype)."""
    return _rope_sbhd(ops(_LIBRARY).fused_rope_forward_cached, t, (cos_, sin_), transpose_output_memory,
                      tensor_format, interleaved, start_positions)


def fused_apply_rotary_pos_emb_thd(t: torch.Tensor, cu_seqlens: torch.Tensor, freqs: torch.Tensor, *,
                                   interleaved: bool = False) -> torch.Tensor:
    """RoPE of packed sequences.

    Args:
        t: [total, h, d]; sequence j is t[cu_seqlens[j]:cu_seqlens[j + 1]], its k-th token at position k.
        cu_seqlens: int32 [sequences + 1], non-decreasing (tokens outside every sequence are copied).
        freqs: [max_s, 1, 1, d2] angles, float32 or t's dtype.
    """
    return ops(_LIBRARY).fused_rope_forward_thd(t, cu_seqlens, freqs, interleaved=interleaved)


def fused_apply_rotary_pos_emb_2d(t: torch.Tensor, img_h: int, img_w: int, cos_h: torch.Tensor, sin_h: torch.Tensor,
                                  cos_w: torch.Tensor, sin_w: torch.Tensor) -> torch.Tensor:
    """2-D RoPE of image tokens t [b, img_h * img_w, h, d] (row-major pixels).

    The first d/2 dims of each head rotate by the pixel's row (cos_h, sin_h [1, >= img_h, 1, d/2]),
    the last d/2 by its column (cos_w, sin_w [1, >= img_w, 1, d/2]); tables float32 or t's dtype.
    """
    if t.size(1) != img_h * img_w:
        raise ValueError(f"fused_apply_rotary_pos_emb_2d: t has {t.size(1)} tokens, not img_h * img_w = {img_h * img_w}")
    return ops(_LIBRARY).fused_rope_forward_2d(t.unflatten(1, (img_h, img_w)), cos_h, sin_h, cos_w, sin_w)
