"""A fused multi-layer perceptron (NVIDIA/ROCm apex's apex.mlp): every layer ``activation(x @ W.T + b)``,
the whole stack one op forward and one op backward (bias and ReLU in the forward GEMMs' cuBLASLt
epilogues; backward: torch's GEMMs, one elementwise pass per activation derivative and one reduction per
bias gradient, csrc/fused_dense/gemm.h says why; ATen's matmul plus elementwise passes on CPUs).

Input ``[..., mlp_sizes[0]]`` in float32, float16 or bfloat16 (float64 too; upstream: float and half
only) -> ``[..., mlp_sizes[-1]]``, any strides and sizes. Under torch.autocast or amp's O1/O4 casts,
inputs and parameters are cast to the low-precision type first (apex/_autocast.py), as
apex does. Traceable by ``torch.compile(fullgraph=True)``.
"""
from __future__ import annotations

import math
from copy import copy

import torch
from torch import nn

from apex._ops import ops
from apex._autocast import cast_if_autocast_enabled

__all__ = ["MLP", "MlpFunction", "mlp_function"]

# apex's activation numbers (mlp_cuda's `activation` argument).
_ACTIVATIONS = {"none": 0, "relu": 1, "sigmoid": 2}


def mlp_function(bias: int, activation: int, *args: torch.Tensor) -> torch.Tensor:
    """The MLP over ``args = (input, *weights, *biases)``; bias: 1 if biases are given, activation: 0/1/2
    (none/relu/sigmoid). Weights ``[out_l, in_l]``, biases ``[out_l]``."""
    args = cast_if_autocast_enabled(*args)
    return ops("fused_dense").mlp_forward(bias, activation, list(args))[0]


class MlpFunction:
    """Upstream's autograd.Function name: ``MlpFunction.apply(bias, activation, *args)`` is the
    differentiable op (C++ formula), without autocast casting."""

    @staticmethod
    def apply(bias: int, activation: int, *args: torch.Tensor) -> torch.Tensor:
        return ops("fused_dense").mlp_forward(bias, activation, list(args))[0]


class MLP(nn.Module):
    """Linear layers of sizes ``mlp_sizes`` (``[1024, 1024, 1]``: two layers), each followed by
    ``activation`` ('relu', 'sigmoid' or 'none'), the last one included, as upstream.

    Parameters are ``weight_<i>`` ``[mlp_sizes[i+1], mlp_sizes[i]]`` and ``bias_<i>``; ``weights`` and
    ``biases`` list them.
    """

    def __init__(self, mlp_sizes, bias: bool = True, activation: str = "relu"):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise TypeError(f"activation must be relu, sigmoid or none, got {activation!r}")
        self.num_layers = len(mlp_sizes) - 1
        self.mlp_sizes = copy(mlp_sizes)
        self.bias = 1 if bias else 0
        self.activation = _ACTIVATIONS[activation]
        for i in range(self.num_layers):
            setattr(self, f"weight_{i}", nn.Parameter(torch.empty(mlp_sizes[i + 1], mlp_sizes[i])))
            if self.bias:
                setattr(self, f"bias_{i}", nn.Parameter(torch.empty(mlp_sizes[i + 1])))
        self.reset_parameters()

    # Looked up on every use, so that they stay the module's parameters whatever replaces them
    # (a dtype conversion that swaps Parameter objects, load_state_dict(assign=True), ...).
    @property
    def weights(self) -> list[nn.Parameter]:
        return [getattr(self, f"weight_{i}") for i in range(self.num_layers)]

    @property
    def biases(self) -> list[nn.Parameter]:
        return [getattr(self, f"bias_{i}") for i in range(self.num_layers)] if self.bias else []

    def reset_parameters(self) -> None:
        """apex's initialisation: normal weights with std sqrt(2 / (fan_in + fan_out)), biases sqrt(1 / fan_out)."""
        for weight in self.weights:
            nn.init.normal_(weight, 0.0, math.sqrt(2.0 / float(weight.size(0) + weight.size(1))))
        for bias in self.biases:
            nn.init.normal_(bias, 0.0, math.sqrt(1.0 / float(bias.size(0))))

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        return mlp_function(self.bias, self.activation, input, *self.weights, *self.biases)

    def extra_repr(self) -> str:
        return f"MLP sizes: {self.mlp_sizes}, Bias={self.bias}, activation={self.activation}"
