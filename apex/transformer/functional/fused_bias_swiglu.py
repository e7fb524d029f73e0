"""Fused bias-SwiGLU, y = silu(x1 + b1) * (x2 + b2) over the two halves (gate, then up) of the last
dimension, over the ``fused_bias_swiglu`` ops (ROCm apex has the kernels; this adds the autograd
function and module it lacks).

``fused_bias_swiglu`` is differentiable in C++ (no Python per call); its backward computes the
input gradient and, when the bias needs one, the bias gradient in the same pass over the data.
"""
from __future__ import annotations

from typing import Optional

import torch

from apex._ops import ops

__all__ = ["fused_bias_swiglu", "FusedBiasSwiGLUFunction", "FusedBiasSwiGLU"]

_LIBRARY = "fused_bias_swiglu"


def fused_bias_swiglu(input: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
    """silu(input[..., :H] + bias[:H]) * (input[..., H:] + bias[H:]).

    Args:
        input: [..., 2H], float32 / float16 / bfloat16 / float64 (any strides).
        bias: [2H] of input's dtype, or None.
    Returns:
        [..., H], contiguous, input's dtype.
    """
    return ops(_LIBRARY).fused_bias_swiglu_forward(input, bias)


class FusedBiasSwiGLUFunction(torch.autograd.Function):
    """fused_bias_swiglu as a torch.autograd.Function (``FusedBiasSwiGLUFunction.apply(input, bias)``)."""

    @staticmethod
    def forward(ctx, input, bias):
        ctx.save_for_backward(input, bias)
        return ops(_LIBRARY).fused_bias_swiglu_forward(input, bias)

    @staticmethod
    def backward(ctx, grad_output):
        input, bias = ctx.saved_tensors
        if bias is not None and ctx.needs_input_grad[1]:
            return ops(_LIBRARY).fused_bias_swiglu_backward_with_bias(grad_output, input, bias)
        return ops(_LIBRARY).fused_bias_swiglu_backward(grad_output, input, bias), None


class FusedBiasSwiGLU(torch.nn.Module):
    """Module form of fused_bias_swiglu: ``FusedBiasSwiGLU()(input, bias=None)``; the bias belongs to the
    projection before it (Megatron's linear_fc1 returns it separately when bias fusion is on)."""

    def forward(self, input: torch.Tensor, bias: Optional[torch.Tensor] = None) -> torch.Tensor:
        return fused_bias_swiglu(input, bias)
