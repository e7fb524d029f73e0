"""Fused dense layers (NVIDIA/ROCm apex's apex.fused_dense): linear + bias, and linear + GELU + linear,
as single ops whose forward GEMMs carry the bias and the tanh GELU in their epilogues (cuBLASLt on
GPUs; ATen's matmul plus one elementwise pass on CPUs and for the exact GELU); the backward runs
torch's GEMMs plus one pass per GELU derivative and bias gradient (csrc/fused_dense/gemm.h says why).

Inputs are ``[..., in_features]`` in float32, float16 or bfloat16 (float64 too) with any strides
(row-major and transposed views are read in place, other layouts copied once), any sizes (odd, batch 1,
empty); weights ``[out_features, in_features]`` and biases ``[out_features]`` of the input's dtype. Under
torch.autocast or amp's O1/O4 casts, inputs and parameters are cast to the low-precision type first
(_autocast.py), as apex does.
Every function is differentiable through a C++ formula and traceable by
``torch.compile(fullgraph=True)``.

GELU is exact (``erf``, as ``torch.nn.GELU()``) by default; ``approximate="tanh"`` selects the tanh
approximation, which cuBLASLt fuses into the GEMM (upstream apex always used it, silently: the
output mismatch of apex #1394 / #1605).
"""
from __future__ import annotations

import math
from typing import Optional

import torch
from torch import nn

from apex._ops import ops
from apex._autocast import cast_if_autocast_enabled

__all__ = [
    "FusedDense", "FusedDenseGeluDense", "FusedDenseFunc", "DenseNoBiasFunc", "FusedDenseGeluDenseFunc",
    "fused_dense_function", "dense_no_bias_function", "fused_dense_gelu_dense_function",
]

_LIBRARY = "fused_dense"


def fused_dense_function(input: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    """``input @ weight.T + bias``: input ``[..., in]``, weight ``[out, in]``, bias ``[out]`` or None -> ``[..., out]``."""
    input, weight, bias = cast_if_autocast_enabled(input, weight, bias)
    return ops(_LIBRARY).fused_dense_linear_bias_forward(input, weight, bias)


def dense_no_bias_function(input: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``input @ weight.T``: input ``[..., in]``, weight ``[out, in]`` -> ``[..., out]``."""
    return fused_dense_function(input, weight, None)


def fused_dense_gelu_dense_function(input: torch.Tensor, weight1: torch.Tensor, bias1: Optional[torch.Tensor],
                                    weight2: torch.Tensor, bias2: Optional[torch.Tensor],
                                    approximate: str = "none") -> torch.Tensor:
    """``gelu(input @ weight1.T + bias1) @ weight2.T + bias2``.

    input ``[..., in]``, weight1 ``[hidden, in]``, bias1 ``[hidden]``, weight2 ``[out, hidden]``, bias2 ``[out]``
    (biases may be None) -> ``[..., out]``. ``approximate``: "none" (exact GELU) or "tanh".
    """
    input, weight1, bias1, weight2, bias2 = cast_if_autocast_enabled(input, weight1, bias1, weight2, bias2)
    return ops(_LIBRARY).fused_dense_linear_gelu_linear_forward(input, weight1, bias1, weight2, bias2, approximate)[1]


# NVIDIA apex's names for the functional forms.
_fused_dense = fused_dense_function
_dense_no_bias = dense_no_bias_function
_fused_dense_gelu_dense = fused_dense_gelu_dense_function


class _OpFunction:
    """Upstream's autograd.Function names: ``X.apply(*args)`` is the differentiable op (its formula is
    C++), without autocast casting, as upstream's ``apply`` had none."""

    def __init__(self, *args, **kwargs):
        raise TypeError(f"{type(self).__name__} is used through {type(self).__name__}.apply(...)")


class FusedDenseFunc(_OpFunction):
    @staticmethod
    def apply(input, weight, bias):
        return ops(_LIBRARY).fused_dense_linear_bias_forward(input, weight, bias)


class DenseNoBiasFunc(_OpFunction):
    @staticmethod
    def apply(input, weight):
        return ops(_LIBRARY).fused_dense_linear_bias_forward(input, weight, None)


class FusedDenseGeluDenseFunc(_OpFunction):
    @staticmethod
    def apply(input, weight1, bias1, weight2, bias2):
        return ops(_LIBRARY).fused_dense_linear_gelu_linear_forward(input, weight1, bias1, weight2, bias2)[1]


def _init_linear(weight: torch.Tensor, bias: Optional[torch.Tensor]) -> None:
    """torch.nn.Linear's initialisation (upstream NVIDIA apex left the memory uninitialised)."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        fan_in = weight.shape[1]
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(bias, -bound, bound)


class FusedDense(nn.Module):
    """``nn.Linear`` as one fused op: ``y = x @ weight.T + bias``; x ``[..., in_features]`` -> ``[..., out_features]``."""

    def __init__(self, in_features: int, out_features: int, bias: bool = True, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(out_features, in_features, **factory))
        self.register_parameter("bias", nn.Parameter(torch.empty(out_features, **factory)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_linear(self.weight, self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return fused_dense_function(input, self.weight, self.bias)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}"


class FusedDenseGeluDense(nn.Module):
    """Linear -> GELU -> Linear as one fused op: x ``[..., in_features]`` -> ``[..., out_features]``.

    ``approximate``: "none" (exact GELU, ``nn.GELU()``) or "tanh" (``nn.GELU(approximate="tanh")``,
    fused into the first GEMM's epilogue).
    """

    def __init__(self, in_features: int, intermediate_features: int, out_features: int, bias: bool = True,
                 approximate: str = "none", device=None, dtype=None):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise ValueError(f"FusedDenseGeluDense: approximate must be 'none' or 'tanh', got {approximate!r}")
        factory = {"device": device, "dtype": dtype}
        self.in_features = in_features
        self.intermediate_features = intermediate_features
        self.out_features = out_features
        self.approximate = approximate
        self.weight1 = nn.Parameter(torch.empty(intermediate_features, in_features, **factory))
        self.register_parameter("bias1", nn.Parameter(torch.empty(intermediate_features, **factory)) if bias else None)
        self.weight2 = nn.Parameter(torch.empty(out_features, intermediate_features, **factory))
        self.register_parameter("bias2", nn.Parameter(torch.empty(out_features, **factory)) if bias else None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        _init_linear(self.weight1, self.bias1)
        _init_linear(self.weight2, self.bias2)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return fused_dense_gelu_dense_function(input, self.weight1, self.bias1, self.weight2, self.bias2,
                                               self.approximate)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, intermediate_features={self.intermediate_features}, "
                f"out_features={self.out_features}, bias={self.bias1 is not None}, approximate={self.approximate!r}")
