"""The functions of NVIDIA apex's ``group_norm_cuda`` module:

    y, sums = group_norm_cuda.forward(x, G, weight, bias, eps, passes, with_swish)
    dx, dw, db = group_norm_cuda.backward(grad_output, sums, x, G, weight, bias, eps, passes, with_swish)

``sums`` is opaque to callers: here the per-(sample, group) mean then rstd, float32, ``[2 * N * G]``.
``passes`` chose between NVIDIA apex's two kernels; one kernel serves both here."""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["forward", "backward"]


def forward(x: torch.Tensor, G: int, weight: torch.Tensor, bias: torch.Tensor, eps: float, passes: int = 1,
            with_swish: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    y, mean, rstd = ops("group_norm_cuda").group_norm_forward(x, G, weight, bias, eps, with_swish)
    return y, torch.cat([mean.flatten(), rstd.flatten()])


def backward(grad_output: torch.Tensor, sums: torch.Tensor, x: torch.Tensor, G: int, weight: torch.Tensor,
             bias: torch.Tensor, eps: float, passes: int = 1,
             with_swish: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    mean, rstd = sums.view(2, x.shape[0], G).unbind(0)
    return ops("group_norm_cuda").group_norm_backward(grad_output, x, mean, rstd, G, weight, bias, with_swish)
