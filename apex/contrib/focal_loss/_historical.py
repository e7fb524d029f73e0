"""The functions of NVIDIA apex's ``focal_loss_cuda`` module, whose forward also returned the
unnormalised gradient for its backward to scale in place:

    loss, partial_grad = focal_loss_cuda.forward(cls_output, targets, num_positives_sum,
                                                 num_real_classes, alpha, gamma, smoothing)
    grad_input = focal_loss_cuda.backward(grad_loss, partial_grad, num_positives_sum)  # partial_grad, scaled

apex.contrib.focal_loss does not store that gradient (it recomputes it in its backward pass); these
two functions keep the old protocol for code that calls the module directly."""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["forward", "backward"]


def forward(cls_output: torch.Tensor, cls_targets_at_level: torch.Tensor, num_positives_sum: torch.Tensor,
            num_real_classes: int, alpha: float, gamma: float,
            smoothing_factor: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    library = ops("focal_loss_cuda")
    args = (cls_targets_at_level, num_positives_sum, num_real_classes, alpha, gamma, smoothing_factor)
    loss = library.focal_loss_forward(cls_output, *args)
    # The gradient for grad_loss == num_positives_sum is the unnormalised sum's gradient.
    partial_grad = library.focal_loss_backward(num_positives_sum.reshape(()), cls_output, *args)
    return loss, partial_grad


def backward(grad_output: torch.Tensor, partial_grad: torch.Tensor, num_positives_sum: torch.Tensor) -> torch.Tensor:
    # The factor stays float32 (the multiply runs in float32 and rounds once), as in NVIDIA apex.
    return partial_grad.mul_(grad_output / num_positives_sum)
