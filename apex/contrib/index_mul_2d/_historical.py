"""The functions of NVIDIA apex's ``fused_index_mul_2d`` module, which write into tensors the caller
allocates: ``float_forward(out, in1, in2, idx1)``, ``float_backward(grad_in1, grad_in2, grad_out, in1,
in2, idx1)`` (adds into grad_in1), ``float_backward_backward(grad_grad_out, grad_in1, grad_in2, grad_out,
grad_grad_in1, grad_grad_in2, in1, in2, idx1)``, and the same for ``half_``. Any dtype the ops take
works with either name."""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = ["float_forward", "half_forward", "float_backward", "half_backward", "float_backward_backward",
           "half_backward_backward"]


def float_forward(out: torch.Tensor, in1: torch.Tensor, in2: torch.Tensor, idx1: torch.Tensor) -> None:
    out.copy_(ops("fused_index_mul_2d").index_mul_2d(in1, in2, idx1))


def float_backward(grad_in1: torch.Tensor, grad_in2: torch.Tensor, grad_out: torch.Tensor, in1: torch.Tensor,
                   in2: torch.Tensor, idx1: torch.Tensor) -> None:
    into_in1, into_in2 = ops("fused_index_mul_2d").index_mul_2d_backward(grad_out, in1, in2, idx1)
    grad_in1.add_(into_in1)
    grad_in2.copy_(into_in2)


def float_backward_backward(grad_grad_out: torch.Tensor, grad_in1: torch.Tensor, grad_in2: torch.Tensor,
                            grad_out: torch.Tensor, grad_grad_in1: torch.Tensor, grad_grad_in2: torch.Tensor,
                            in1: torch.Tensor, in2: torch.Tensor, idx1: torch.Tensor) -> None:
    ggo, into_in1, into_in2 = ops("fused_index_mul_2d").index_mul_2d_backward_backward(
        grad_grad_in1, grad_grad_in2, grad_out, in1, in2, idx1)
    grad_grad_out.copy_(ggo)
    grad_in1.add_(into_in1)
    grad_in2.copy_(into_in2)


half_forward = float_forward
half_backward = float_backward
half_backward_backward = float_backward_backward
