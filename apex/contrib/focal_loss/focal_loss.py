"""NVIDIA apex's fused sigmoid focal loss (torch.ops.apex.focal_loss_*)."""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["FocalLoss", "focal_loss"]


def focal_loss(cls_output: torch.Tensor, cls_targets_at_level: torch.Tensor, num_positive_sum: torch.Tensor,
               num_real_classes: int, alpha: float, gamma: float, label_smoothing: float = 0.0) -> torch.Tensor:
    """Sum over anchors and real classes of the sigmoid focal loss, divided by ``num_positive_sum``.

    Args:
        cls_output: logits ``[..., classes]``, float32 / float16 / bfloat16 / float64; classes past
            ``num_real_classes`` are padding (no loss, zero gradient).
        cls_targets_at_level: ``[...]`` int64 per anchor: the positive class, -1 for background (every
            class negative) or -2 to ignore the anchor (no loss, zero gradient).
        num_positive_sum: float32 tensor of one element, on the logits' device (read there: no sync).
        num_real_classes: classes that count.
        alpha: weight of positives (negatives get 1 - alpha).
        gamma: focusing exponent of the modulating factor ``(1 - p_t)^gamma``.
        label_smoothing: s; targets become 1 - s/2 (positive) and s/2 (negative).

    Returns:
        The loss, a float32 0-dim tensor (float64 for float64 logits), differentiable in cls_output.

    Precision: the loss is summed in float32 (float64 for float64 logits). On CUDA the gradient of
    bfloat16 logits (label smoothing in [0, 1]) computes its O(1) factor in packed float16, which adds
    at most ~0.25% relative error (emulated), about the bfloat16 rounding of the result itself; every
    other case computes in float32 / float64.
    """
    return ops("focal_loss_cuda").focal_loss_forward(cls_output, cls_targets_at_level, num_positive_sum,
                                                     num_real_classes, alpha, gamma, label_smoothing)


class FocalLoss:
    """NVIDIA apex's interface: ``FocalLoss.apply(cls_output, cls_targets_at_level, num_positives_sum,
    num_real_classes, alpha, gamma, label_smoothing=0.0)``; see :func:`focal_loss`."""

    apply = staticmethod(focal_loss)
