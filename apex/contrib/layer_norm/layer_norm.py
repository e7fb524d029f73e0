"""FastLayerNorm (NVIDIA apex contrib): LayerNorm over the last dimension, on the fused_layer_norm kernels.

NVIDIA apex compiles a second LayerNorm implementation for this module; here it is the same op as
apex.normalization's FusedLayerNorm (same kernels, same C++ autograd, same host cost), with
FastLayerNorm's dtype rule: the output takes the parameters' dtype. That covers upstream's kernel
list: data and parameters of one dtype, float32 parameters with 16-bit data, and float32 data with
16-bit parameters (computed with the parameters widened to float32, the output rounded once to
their dtype). Under autocast, data and parameters are cast to the autocast dtype first.
"""
from __future__ import annotations

import torch
from torch import nn

from apex._ops import ops
from apex.normalization.fused_layer_norm import _LIBRARY, _normalize, _registered_parameters

_SIXTEEN_BIT = (torch.float16, torch.bfloat16)


def fast_layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, epsilon: float = 1e-5,
                    memory_efficient: bool = False) -> torch.Tensor:
    """LayerNorm of ``x`` (..., hidden) with ``weight`` / ``bias`` (hidden,); output in the parameters' dtype.

    Differentiable; ``memory_efficient`` keeps the output instead of the input for the backward.
    """
    shape = weight.shape
    if x.dtype == torch.float32 and weight.dtype in _SIXTEEN_BIT and not torch._C._is_any_autocast_enabled():
        return _normalize(x, shape, weight.float(), bias.float(), epsilon, memory_efficient, rms=False,
                          mixed=True).to(weight.dtype)
    return _normalize(x, shape, weight, bias, epsilon, memory_efficient, rms=False, mixed=True)


class FastLayerNormFN:
    """NVIDIA apex's ``FastLayerNormFN.apply(x, gamma, beta, epsilon, memory_efficient=False)`` (Megatron calls it)."""

    @staticmethod
    def apply(x, gamma, beta, epsilon, memory_efficient=False):
        return fast_layer_norm(x, gamma, beta, epsilon, memory_efficient)


class FastLayerNorm(nn.Module):
    """LayerNorm over the last dimension (``hidden_size``), weight 1 and bias 0 at start.

    Args: hidden_size, eps, memory_efficient (the backward keeps the output, not the input).
    Input ``(*, hidden_size)`` in float32 / float16 / bfloat16; output same shape, parameters' dtype.
    """

    def __init__(self, hidden_size: int, eps: float = 1e-5, memory_efficient: bool = False):
        super().__init__()
        ops(_LIBRARY)  # build (first use) or load the kernels now, not in the first forward
        self.epsilon = eps
        self.memory_efficient = memory_efficient
        self.weight = nn.Parameter(torch.empty(hidden_size))
        self.bias = nn.Parameter(torch.empty(hidden_size))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        nn.init.ones_(self.weight)
        nn.init.zeros_(self.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, bias = _registered_parameters(self)
        return fast_layer_norm(x, weight, bias, self.epsilon, self.memory_efficient)

    def extra_repr(self) -> str:
        return f"{self.weight.numel()}, eps={self.epsilon}, memory_efficient={self.memory_efficient}"
