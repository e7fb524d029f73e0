"""torch.compile and autograd support for the apex::layer_norm_* / apex::rms_norm_* ops.

The ops themselves (schemas, CPU and CUDA kernels) are compiled C++ (csrc/layer_norm/);
loading that module defines them. This file adds what torch needs around them: fake
implementations (shapes and dtypes, for tracing) and the backward formulas.
"""
from __future__ import annotations

import math

import torch

_OP_MODULE = "fused_layer_norm_cuda"
_loaded = False


def ensure_loaded() -> None:
    """Compile (first time) or load the op module and register fakes and autograd, once."""
    global _loaded
    if _loaded:
        return
    from op_builder import load_op

    load_op(_OP_MODULE)
    _register()
    _loaded = True


def _statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _statistics(input: torch.Tensor, normalized_shape) -> torch.Tensor:
    rows = input.numel() // math.prod(normalized_shape)
    return input.new_empty((rows,), dtype=_statistics_dtype(input.dtype))


def _output(input: torch.Tensor, weight, bias) -> torch.Tensor:
    defining = weight if weight is not None else bias
    return input.new_empty(input.shape, dtype=input.dtype if defining is None else defining.dtype)


def _grad_or_empty(param, like: torch.Tensor) -> torch.Tensor:
    return like.new_empty((0,)) if param is None else param.new_empty(param.shape)


def _layer_norm_fwd_fake(input, normalized_shape, weight, bias, eps, memory_efficient=False):
    return _output(input, weight, bias), _statistics(input, normalized_shape), _statistics(input, normalized_shape)


def _rms_norm_fwd_fake(input, normalized_shape, weight, eps, memory_efficient=False):
    return _output(input, weight, None), _statistics(input, normalized_shape)


def _layer_norm_bwd_fake(grad_output, mean, invvar, input_or_output, normalized_shape, weight, bias, eps,
                         memory_efficient):
    return (input_or_output.new_empty(input_or_output.shape), _grad_or_empty(weight, grad_output),
            _grad_or_empty(bias, grad_output))


def _rms_norm_bwd_fake(grad_output, invvar, input_or_output, normalized_shape, weight, eps, memory_efficient):
    return input_or_output.new_empty(input_or_output.shape), _grad_or_empty(weight, grad_output)


def _setup_context(ctx, inputs, output):
    """Shared by both norms: keep the input, or the output when memory_efficient (NVIDIA apex's choice)."""
    input, normalized_shape, weight = inputs[:3]
    bias = inputs[3] if len(inputs) == 6 else None
    eps, memory_efficient = inputs[-2:]
    ctx.normalized_shape, ctx.eps, ctx.memory_efficient = normalized_shape, eps, memory_efficient
    ctx.input_dtype = input.dtype
    # mean / invvar get no gradient: without this autograd fills a zero tensor for each (two more
    # kernels per backward) only for the formulas below to ignore them.
    ctx.set_materialize_grads(False)
    kept = output[0] if memory_efficient else input
    ctx.save_for_backward(kept, *output[1:], weight, bias)


def _layer_norm_backward(ctx, grad_output, grad_mean, grad_invvar):
    if grad_output is None:  # only mean / invvar were used
        return None, None, None, None, None, None
    kept, mean, invvar, weight, bias = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = torch.ops.apex.layer_norm_bwd(
        grad_output, mean, invvar, kept, ctx.normalized_shape, weight, bias, ctx.eps, ctx.memory_efficient)
    # memory_efficient with float32 parameters: the kept output is float32, the input was not.
    return (grad_input.to(ctx.input_dtype), None, grad_weight if weight is not None else None,
            grad_bias if bias is not None else None, None, None)


def _rms_norm_backward(ctx, grad_output, grad_invvar):
    if grad_output is None:  # only invvar was used
        return None, None, None, None, None
    kept, invvar, weight, _ = ctx.saved_tensors
    grad_input, grad_weight = torch.ops.apex.rms_norm_bwd(
        grad_output, invvar, kept, ctx.normalized_shape, weight, ctx.eps, ctx.memory_efficient)
    return grad_input.to(ctx.input_dtype), None, grad_weight if weight is not None else None, None, None


def _register() -> None:
    for name, fake in (("layer_norm_fwd", _layer_norm_fwd_fake), ("rms_norm_fwd", _rms_norm_fwd_fake),
                       ("layer_norm_bwd", _layer_norm_bwd_fake), ("rms_norm_bwd", _rms_norm_bwd_fake)):
        torch.library.register_fake(f"apex::{name}", fake)
    torch.library.register_autograd("apex::layer_norm_fwd", _layer_norm_backward, setup_context=_setup_context)
    torch.library.register_autograd("apex::rms_norm_fwd", _rms_norm_backward, setup_context=_setup_context)
