"""The functions of NVIDIA apex's ``fused_layer_norm_cuda`` module (names, argument order, list returns).

``import fused_layer_norm_cuda`` (compatibility/) serves these, over the ``torch.ops.apex``
layer_norm_* / rms_norm_* ops, so one function runs CPU and CUDA tensors. Outputs and statistics:
``mean`` / ``invvar`` have one float32 entry per row (float64 for float64 input).
"""
from __future__ import annotations

import torch

from apex._ops import ops

__all__ = [
    "forward", "forward_affine", "forward_affine_mixed_dtypes", "backward", "backward_affine",
    "rms_forward", "rms_forward_affine", "rms_forward_affine_mixed_dtypes", "rms_backward", "rms_backward_affine",
]


def _apex():
    return ops("fused_layer_norm_cuda")


def _same_dtype(input: torch.Tensor, gamma: torch.Tensor, function: str) -> None:
    # NVIDIA apex's non-mixed entry points read gamma as the input's dtype; say so instead.
    if gamma.dtype != input.dtype:
        raise RuntimeError(f"{function}: gamma has dtype {gamma.dtype} but input has dtype {input.dtype}; "
                           f"use {function}_mixed_dtypes for float32 parameters")


def forward(input, normalized_shape, epsilon):
    """LayerNorm without parameters -> [output, mean, invvar]."""
    return list(_apex().layer_norm_fwd(input, normalized_shape, None, None, epsilon))


def forward_affine_mixed_dtypes(input, normalized_shape, gamma, beta, epsilon):
    """LayerNorm, output in gamma's dtype (float32 gamma/beta with a 16-bit input) -> [output, mean, invvar]."""
    return list(_apex().layer_norm_fwd(input, normalized_shape, gamma, beta, epsilon))


def forward_affine(input, normalized_shape, gamma, beta, epsilon):
    """LayerNorm with gamma / beta of the input's dtype -> [output, mean, invvar]."""
    _same_dtype(input, gamma, "forward_affine")
    return forward_affine_mixed_dtypes(input, normalized_shape, gamma, beta, epsilon)


def backward(dout, mean, invvar, input_or_output, normalized_shape, epsilon, memory_efficient):
    """grad_input of forward(); input_or_output is the output when memory_efficient (mean may be None then)."""
    return _apex().layer_norm_bwd(dout, mean, invvar, input_or_output, normalized_shape, None, None, epsilon,
                                  memory_efficient)[0]


def backward_affine(dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, epsilon, memory_efficient):
    """[grad_input, grad_gamma, grad_beta] of forward_affine()."""
    return list(_apex().layer_norm_bwd(dout, mean, invvar, input_or_output, normalized_shape, gamma, beta, epsilon,
                                       memory_efficient))


def rms_forward(input, normalized_shape, epsilon):
    """RMSNorm without weight -> [output, invvar]."""
    return list(_apex().rms_norm_fwd(input, normalized_shape, None, epsilon))


def rms_forward_affine_mixed_dtypes(input, normalized_shape, gamma, epsilon):
    """RMSNorm, output in gamma's dtype -> [output, invvar]."""
    return list(_apex().rms_norm_fwd(input, normalized_shape, gamma, epsilon))


def rms_forward_affine(input, normalized_shape, gamma, epsilon):
    """RMSNorm with gamma of the input's dtype -> [output, invvar]."""
    _same_dtype(input, gamma, "rms_forward_affine")
    return rms_forward_affine_mixed_dtypes(input, normalized_shape, gamma, epsilon)


def rms_backward(dout, invvar, input_or_output, normalized_shape, epsilon, memory_efficient):
    """grad_input of rms_forward()."""
    return _apex().rms_norm_bwd(dout, invvar, input_or_output, normalized_shape, None, epsilon, memory_efficient)[0]


def rms_backward_affine(dout, invvar, input_or_output, normalized_shape, gamma, epsilon, memory_efficient):
    """[grad_input, grad_gamma] of rms_forward_affine()."""
    return list(_apex().rms_norm_bwd(dout, invvar, input_or_output, normalized_shape, gamma, epsilon,
                                     memory_efficient))
