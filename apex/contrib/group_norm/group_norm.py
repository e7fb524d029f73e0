"""GroupNorm with a fused SiLU/Swish (torch.ops.apex.group_norm_*), NVIDIA apex's module interface.

NVIDIA apex served 24 channel counts and 16 or 32 groups in NHWC only, and fell back to PyTorch
elsewhere; here one kernel serves every channel count, group count, layout (channels_last or
contiguous) and float dtype, on CUDA and CPU. On CUDA, NHWC data is read once from HBM per pass
(each round of samples is re-read from L2), as a copy would.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor
from torch.nn import init
from torch.nn.parameter import Parameter

from apex._ops import ops

__all__ = ["GroupNorm", "group_norm"]

_ACTIVATIONS = {None: False, "": False, "silu": True, "swish": True}


def _fused_silu(act: Optional[str]) -> bool:
    key = act.lower() if isinstance(act, str) else act
    if key not in _ACTIVATIONS:
        raise ValueError(f"group_norm: act must be None, 'silu' or 'swish', got {act!r}")
    return _ACTIVATIONS[key]


def group_norm(x: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-5, act: Optional[str] = None) -> Tensor:
    """``act(F.group_norm(x, num_groups, weight, bias, eps))`` in one kernel per pass.

    Args:
        x: ``[N, C, *]``, float32 / float16 / bfloat16 / float64; channels_last (4-D) and
            channels_last_3d (5-D) data stay in that layout, anything else is computed as NCHW.
        num_groups: G, dividing C.
        weight, bias: ``[C]`` of any float dtype (float32 with 16-bit x is NVIDIA apex's mix), or None.
        act: None, or "silu" / "swish" (the same function) applied to the normalized output.

    Returns:
        y of x's shape, dtype and layout, differentiable in x, weight and bias (gradients of
        weight and bias in their own dtypes, accumulated in float32).
    """
    return ops("group_norm_cuda").group_norm_forward(x, num_groups, weight, bias, eps, _fused_silu(act))[0]


class GroupNorm(torch.nn.Module):
    """``torch.nn.GroupNorm`` with NVIDIA apex's ``act`` argument: ``GroupNorm(num_groups, num_channels,
    eps=1e-5, affine=True, device=None, dtype=None, act=None | "silu" | "swish")``."""

    __constants__ = ["num_groups", "num_channels", "eps", "affine", "act"]
    num_groups: int
    num_channels: int
    eps: float
    affine: bool
    act: Optional[str]

    def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True, device=None,
                 dtype=None, act: Optional[str] = None) -> None:
        super().__init__()
        if num_channels % num_groups != 0:
            raise ValueError("num_channels must be divisible by num_groups")
        _fused_silu(act)
        self.num_groups = num_groups
        self.num_channels = num_channels
        self.eps = eps
        self.affine = affine
        self.act = act.lower() if act else act
        factory_kwargs = {"device": device, "dtype": dtype}
        if affine:
            self.weight = Parameter(torch.empty(num_channels, **factory_kwargs))
            self.bias = Parameter(torch.empty(num_channels, **factory_kwargs))
        else:
            self.register_parameter("weight", None)
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.affine:
            init.ones_(self.weight)
            init.zeros_(self.bias)

    def forward(self, input: Tensor) -> Tensor:
        return group_norm(input, self.num_groups, self.weight, self.bias, self.eps, self.act)

    def extra_repr(self) -> str:
        act = f", act={self.act}" if self.act else ""
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}, affine={self.affine}{act}"

    # NVIDIA apex's table of shapes its Blackwell-only second kernel took, which its tests consult
    # before skipping; one kernel serves every shape here, so it lists none.
    GN_V2_SUPPORTED_LOWER_BOUND_SM_COUNT: dict = {}


def _entry_point(x, G, weight, bias, eps, act=None):
    return group_norm(x, G, weight, bias, eps, act)


# NVIDIA apex's algorithm-specific entry points (one-pass, two-pass, v2): one kernel serves them all.
cuda_group_norm_nhwc_one_pass = _entry_point
cuda_group_norm_nhwc_two_pass = _entry_point
cuda_group_norm_v2_nhwc = _entry_point


@functools.cache
def get_cc_and_sm_count(device_index: int):
    """((major, minor), multiprocessor count) of a CUDA device, as NVIDIA apex's module offers."""
    props = torch.cuda.get_device_properties(device_index)
    return (props.major, props.minor), props.multi_processor_count
