"""Softmax cross entropy with label smoothing over ``[rows, classes]`` logits (torch.ops.apex.xentropy_*).

Forward reads the logits once and writes only a loss and a log-sum-exp per row; backward reads them
once more and writes the gradient (probabilities are recomputed, never stored). Any vocabulary size,
float32 / float16 / bfloat16 / float64 logits, CPU and CUDA, traceable by ``torch.compile``.
"""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["SoftmaxCrossEntropyLoss", "softmax_cross_entropy"]

# torch's ignore_index default (F.cross_entropy, nn.NLLLoss).
IGNORE_INDEX = -100


def _losses(logits: torch.Tensor, labels: torch.Tensor, smoothing: float, ignore_index: int) -> torch.Tensor:
    return ops("xentropy_cuda").xentropy_forward(logits, labels, smoothing, False, ignore_index)[0]


class SoftmaxCrossEntropyLoss:
    """NVIDIA apex's interface: ``SoftmaxCrossEntropyLoss.apply(logits, labels, smoothing=0.0,
    padding_idx=0, half_to_float=False)`` returns the per-row losses, differentiable in logits.

    Args:
        logits: ``[rows, classes]``, float32 / float16 / bfloat16 / float64, unit stride over classes
            (other layouts are copied).
        labels: ``[rows]`` int64, each in ``[0, classes)`` or ``padding_idx``.
        smoothing: label smoothing ``s`` in [0, 1]; the loss is
            ``-(1 - s) log p[label] - s mean_j log p[j]``.
        padding_idx: rows whose label equals it get loss 0 and gradient 0. **Note the default 0**:
            as in NVIDIA apex, it silently zeroes every row whose true class is 0. Pass
            ``padding_idx=-100`` (or call :func:`softmax_cross_entropy`) for torch's
            ``ignore_index`` semantics.
        half_to_float: accepted for compatibility; losses are float32 (float64 for float64 logits)
            either way, as NVIDIA apex computes them.

    Returns:
        ``[rows]`` float32 losses (float64 for float64 logits). A label outside ``[0, classes)``
        that is not ``padding_idx`` gives a NaN loss and a NaN gradient row.
    """

    @staticmethod
    def apply(logits: torch.Tensor, labels: torch.Tensor, smoothing: float = 0.0, padding_idx: int = 0,
              half_to_float: bool = False) -> torch.Tensor:
        return _losses(logits, labels, smoothing, padding_idx)


def softmax_cross_entropy(logits: torch.Tensor, labels: torch.Tensor, *, smoothing: float = 0.0,
                          ignore_index: int = IGNORE_INDEX, reduction: str = "none") -> torch.Tensor:
    """``F.cross_entropy(logits, labels, ignore_index=..., label_smoothing=smoothing, reduction=...)``
    with torch's semantics, computed in float32.

    Args:
        logits: ``[rows, classes]`` float32 / float16 / bfloat16 / float64.
        labels: ``[rows]`` int64; rows labelled ``ignore_index`` (default -100) count for nothing.
        reduction: "none" (``[rows]`` losses), "sum", or "mean" (over the rows not ignored; NaN when
            every row is ignored, as in torch).

    Returns:
        float32 losses (float64 for float64 logits), as ``reduction`` says.
    """
    losses = _losses(logits, labels, smoothing, ignore_index)
    if reduction == "none":
        return losses
    if reduction == "sum":
        return losses.sum()
    if reduction == "mean":
        return losses.sum() / (labels != ignore_index).sum()
    raise ValueError(f"softmax_cross_entropy: reduction must be 'none', 'sum' or 'mean', got {reduction!r}")
