"""Fused LayerNorm and RMSNorm (NVIDIA apex's apex.normalization API).

Every function and module takes inputs of shape ``(*, *normalized_shape)`` in float32,
float16 or bfloat16 (float64 too), normalizes over the trailing ``normalized_shape``
dimensions with float32 statistics, and runs on CPU and CUDA tensors through the
``torch.ops.apex`` ops of the ``fused_layer_norm_cuda`` library (C++ kernels and autograd
formulas, which torch.compile traces with ``fullgraph=True``). Under autocast, inputs and
parameters are cast to the autocast dtype first, as in NVIDIA apex. Empty inputs give
empty outputs (and zero parameter grads).

Non-mixed forms return the input's dtype (parameters of another dtype are cast to it,
as torch.nn.LayerNorm does); the ``mixed_dtype_*`` forms and ``MixedFused*`` modules
return the parameters' dtype (e.g. float32 parameters with a bfloat16 input give a
float32 output).

``memory_efficient=True`` makes the backward keep the output instead of the input and
recover the normalized input from it; where the weight holds a zero that is impossible,
and such calls keep the input (finding out reads the weight: one host sync per call on
CUDA, paid only by memory_efficient calls that record a graph).

ONNX export (``torch.onnx.export``, either exporter) sees ``F.layer_norm`` /
``F.rms_norm`` instead of the custom ops: LayerNormalization, or RMSNorm's ReduceMean
decomposition.
"""
from __future__ import annotations

import numbers
from typing import Optional, Sequence, Union

import torch
import torch.nn.functional as F
from torch import nn
from torch._C import _has_torch_function_variadic, _is_any_autocast_enabled, _is_tracing
from torch.compiler import is_dynamo_compiling

from apex._ops import eager_op, ops, through_torch_ops

_LIBRARY = "fused_layer_norm_cuda"
_Shape = Union[int, Sequence[int], torch.Size]


def _int_tuple(normalized_shape: _Shape) -> tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple([int(d) for d in normalized_shape])


# normalized_shape -> _int_tuple(normalized_shape), for the int and tuple-of-int shapes seen so far: the
# conversion costs ~0.4 us of a ~6 us call. Keys are values (equal shapes share an entry), so the table
# holds one entry per shape a program uses.
_CANONICAL_SHAPES: dict[Union[int, tuple], tuple[int, ...]] = {}
_HASHABLE_SHAPE_TYPES = (int, tuple, torch.Size)


def _as_shape(normalized_shape: _Shape) -> tuple[int, ...]:
    if is_dynamo_compiling():  # converted in the trace, as written: dynamo would guard on a global table
        return _int_tuple(normalized_shape)
    shape = _CANONICAL_SHAPES.get(normalized_shape) if type(normalized_shape) in _HASHABLE_SHAPE_TYPES else None
    if shape is None:
        shape = _int_tuple(normalized_shape)
        if type(normalized_shape) is int or (type(normalized_shape) in _HASHABLE_SHAPE_TYPES
                                             and all(type(d) is int for d in normalized_shape)):
            _CANONICAL_SHAPES[normalized_shape] = shape  # exact ints only: no tensor or array kept alive here
    return shape


def _autocast(input: torch.Tensor, *params: Optional[torch.Tensor]):
    device_type = input.device.type
    if not torch.is_autocast_enabled(device_type):
        return (input, *params)
    dtype = torch.get_autocast_dtype(device_type)
    return tuple(t.to(dtype) if t is not None and t.is_floating_point() else t for t in (input, *params))


def _onnx_norm(input, shape, weight, bias, eps, *, rms: bool):
    """The same norm from torch ops every ONNX exporter translates (output in the parameters' dtype):
    F.layer_norm (LayerNormalization), and RMSNorm spelled out, since the TorchScript exporter has no
    aten::rms_norm (ReduceMean of the squares in float32, Sqrt, Div, Mul)."""
    out_dtype = input.dtype if weight is None and bias is None else (weight if weight is not None else bias).dtype
    if not rms:
        return F.layer_norm(input if input.dtype == out_dtype else input.to(out_dtype), shape, weight, bias, eps)
    # No cast that changes nothing: the TorchScript exporter drops such Casts and leaves dangling inputs.
    x = input if input.dtype == torch.float32 else input.float()
    normalized = x * torch.rsqrt(x.pow(2).mean(tuple(range(-len(shape), 0)), keepdim=True) + eps)
    if normalized.dtype != out_dtype:
        normalized = normalized.to(out_dtype)
    return normalized if weight is None else normalized * weight


def _eager_as_is(input, weight, bias, mixed: bool) -> bool:
    """Whether a norm call can go straight to the eager op with its tensors as they are: nothing traces it,
    no argument overrides ``__torch_function__``, autocast is off, and (unless ``mixed``) the parameters
    already have the input's dtype. The common call, decided with a few C-level flags; every other
    call takes the full path below, which ends in the same op when nothing needed changing."""
    # through_torch_ops(input, weight, bias), spelled out (a frame less), then autocast.
    if (is_dynamo_compiling() or torch.compiler._is_compiling_flag or _is_tracing()
            or _has_torch_function_variadic(input, weight, bias) or _is_any_autocast_enabled()):
        return False
    if mixed:
        return True
    dtype = input.dtype
    return (weight is None or weight.dtype == dtype) and (bias is None or bias.dtype == dtype)


def _normalize(input, shape: Sequence[int], weight, bias, eps, memory_efficient, *, rms: bool, mixed: bool):
    """The norm of input over ``shape``: normalized_shape as ints, already through ``_as_shape`` (modules keep it)."""
    if not _eager_as_is(input, weight, bias, mixed):
        # One C call decides the common case; the per-device queries cost ~5 us a call.
        if _is_any_autocast_enabled():
            input, weight, bias = _autocast(input, weight, bias)
        if not mixed:  # parameters in the input's dtype (a non-float input is refused by the op)
            if weight is not None and weight.dtype != input.dtype and input.is_floating_point():
                weight = weight.to(input.dtype)
            if bias is not None and bias.dtype != input.dtype and input.is_floating_point():
                bias = bias.to(input.dtype)
        if through_torch_ops(input, weight, bias):  # tracers and overrides see the ops by name
            if torch.onnx.is_in_onnx_export():  # always traced (torch.export, or torch.jit.trace)
                return _onnx_norm(input, shape, weight, bias, eps, rms=rms)
            if rms:
                return ops(_LIBRARY).rms_norm_fwd(input, shape, weight, eps, memory_efficient)[0]
            return ops(_LIBRARY).layer_norm_fwd(input, shape, weight, bias, eps, memory_efficient)[0]
    # Eager: the forward op's output alone (*_output; the statistics stay in C++, for the backward).
    if rms:
        return eager_op(_LIBRARY, "rms_norm_fwd_output")(input, shape, weight, eps, memory_efficient)
    return eager_op(_LIBRARY, "layer_norm_fwd_output")(input, shape, weight, bias, eps, memory_efficient)


def fused_layer_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    """LayerNorm without affine parameters: ``(x - mean) / sqrt(var + eps)`` over normalized_shape."""
    return _normalize(input, _as_shape(normalized_shape), None, None, eps, memory_efficient, rms=False, mixed=False)


def fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    """LayerNorm with ``weight``/``bias`` of shape normalized_shape; output in input's dtype."""
    return _normalize(input, _as_shape(normalized_shape), weight, bias, eps, memory_efficient, rms=False, mixed=False)


def mixed_dtype_fused_layer_norm_affine(input, weight, bias, normalized_shape, eps=1e-6, memory_efficient=False):
    """LayerNorm with ``weight``/``bias`` (float32 allowed with a half/bfloat16 input); output in weight's dtype."""
    return _normalize(input, _as_shape(normalized_shape), weight, bias, eps, memory_efficient, rms=False, mixed=True)


def fused_rms_norm(input, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMSNorm without weight: ``x / sqrt(mean(x^2) + eps)`` over normalized_shape."""
    return _normalize(input, _as_shape(normalized_shape), None, None, eps, memory_efficient, rms=True, mixed=False)


def fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMSNorm with ``weight`` of shape normalized_shape; output in input's dtype."""
    return _normalize(input, _as_shape(normalized_shape), weight, None, eps, memory_efficient, rms=True, mixed=False)


def mixed_dtype_fused_rms_norm_affine(input, weight, normalized_shape, eps=1e-6, memory_efficient=False):
    """RMSNorm with ``weight`` (float32 allowed with a half/bfloat16 input); output in weight's dtype."""
    return _normalize(input, _as_shape(normalized_shape), weight, None, eps, memory_efficient, rms=True, mixed=True)


_UNREGISTERED = object()


def _registered_parameters(module: nn.Module):
    """``(module.weight, module.bias)``, read from the module's parameter table: nn.Module.__getattr__,
    which ``module.weight`` goes through, costs ~0.6 us a parameter (a tenth of a norm call). Where
    either name has left the table (torch.nn.utils.parametrize moves it out, so does ``del module.weight``
    before a plain attribute takes its place), the attributes are read as usual."""
    parameters = module._parameters
    weight, bias = parameters.get("weight", _UNREGISTERED), parameters.get("bias", _UNREGISTERED)
    if weight is _UNREGISTERED or bias is _UNREGISTERED:
        return module.weight, module.bias
    return weight, bias


class _FusedNorm(nn.Module):
    """Parameters and forward shared by the four modules; subclasses pick bias and mixed dtypes."""

    _rms: bool = False
    _mixed: bool = False

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, elementwise_affine: bool = True,
                 memory_efficient: bool = False):
        super().__init__()
        ops(_LIBRARY)  # build (first use) or load the kernels now, not in the first forward
        self.normalized_shape = tuple(_as_shape(normalized_shape))
        self.eps = eps
        self.elementwise_affine = elementwise_affine
        self.memory_efficient = memory_efficient
        weight = nn.Parameter(torch.empty(self.normalized_shape)) if elementwise_affine else None
        bias = nn.Parameter(torch.empty(self.normalized_shape)) if elementwise_affine and not self._rms else None
        self.register_parameter("weight", weight)
        self.register_parameter("bias", bias)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        if self.weight is not None:
            nn.init.ones_(self.weight)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        weight, bias = _registered_parameters(self)
        return _normalize(input, self.normalized_shape, weight, bias, self.eps, self.memory_efficient,
                          rms=self._rms, mixed=self._mixed)

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, elementwise_affine={self.elementwise_affine}, "
                f"memory_efficient={self.memory_efficient}")


class FusedLayerNorm(_FusedNorm):
    """Drop-in for ``torch.nn.LayerNorm`` (parameters ``weight``, ``bias`` of shape normalized_shape).

    Args: normalized_shape (int or tuple of trailing dims), eps, elementwise_affine,
    memory_efficient (backward keeps the output instead of the input).
    Input ``(*, *normalized_shape)``; output same shape, input's dtype.
    """


class FusedRMSNorm(_FusedNorm):
    """Drop-in for ``torch.nn.RMSNorm`` (parameter ``weight`` of shape normalized_shape).

    Same arguments as FusedLayerNorm; ``x / sqrt(mean(x^2) + eps) * weight``.
    """

    _rms = True


def _mixed_init(module: _FusedNorm, normalized_shape, eps, memory_efficient, kwargs) -> None:
    # NVIDIA apex: mixed modules are always affine; elementwise_affine=False is an error.
    if not kwargs.pop("elementwise_affine", True):
        raise ValueError(f"{type(module).__name__} does not support elementwise_affine=False")
    if kwargs:
        raise TypeError(f"{type(module).__name__} got unexpected arguments {sorted(kwargs)}")
    _FusedNorm.__init__(module, normalized_shape, eps, True, memory_efficient)


class MixedFusedLayerNorm(FusedLayerNorm):
    """FusedLayerNorm whose output takes the parameters' dtype (e.g. float32 parameters, bfloat16 input
    -> float32 output), as NVIDIA apex / Megatron-LM's MixedFusedLayerNorm."""

    _mixed = True

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, *, memory_efficient: bool = False, **kwargs):
        _mixed_init(self, normalized_shape, eps, memory_efficient, kwargs)


class MixedFusedRMSNorm(FusedRMSNorm):
    """FusedRMSNorm whose output takes the weight's dtype (see MixedFusedLayerNorm)."""

    _mixed = True

    def __init__(self, normalized_shape: _Shape, eps: float = 1e-5, *, memory_efficient: bool = False, **kwargs):
        _mixed_init(self, normalized_shape, eps, memory_efficient, kwargs)
