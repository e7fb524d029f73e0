"""``index_mul_2d(in1, in2, idx1) = in1[idx1] * in2`` (torch.ops.apex.index_mul_2d*)."""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["index_mul_2d"]


def index_mul_2d(in1: torch.Tensor, in2: torch.Tensor, idx1: torch.Tensor) -> torch.Tensor:
    """``in1[idx1] * in2`` in one pass, differentiable twice in in1 and in2.

    Args:
        in1: ``[sources, features]``, float32 / float16 / bfloat16 / float64.
        in2: ``[rows, features]``, in1's dtype and device.
        idx1: ``[rows]`` int64 row indices into in1; negative ones count from the end, as torch
            indexing does. An index outside ``[-sources, sources)`` gives a NaN row (and adds nothing
            to in1's gradient) instead of torch's device-side assert.

    Returns:
        ``[rows, features]`` of in2's dtype. in1's gradient is accumulated in float32 (float64 for
        float64) and rounded once, without atomics: the same bits on every run (on CUDA the order
        of the sums also depends on the GPU model, through the kernel's launch shape).
    """
    return ops("fused_index_mul_2d").index_mul_2d(in1, in2, idx1)
