"""torch.compile and autograd support for the apex::layer_norm_* / apex::rms_norm_* ops.

The ops themselves (schemas, CPU and CUDA kernels) are compiled C++ (csrc/layer_norm/);
loading that module defines them. This file adds what torch needs around them: fake
implementations (shapes and dtypes, for tracing) and the backward formulas.

The formulas serve two ways in: ``torch.library.register_autograd`` on the forward ops (what
torch.compile, export and torch.func see), and plain autograd Functions for eager calls, which
cost far less host time per call (``run`` picks one; benchmarks/normalization/host_overhead_norms.py
measures).
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


def _in_input_dtype(ctx, grad_input: torch.Tensor) -> torch.Tensor:
    # memory_efficient with float32 parameters: the kept output is float32, the input was not.
    # (A same-dtype .to() is no work but still ~1 µs of argument parsing.)
    return grad_input if grad_input.dtype == ctx.input_dtype else grad_input.to(ctx.input_dtype)


def _layer_norm_backward(ctx, grad_output, grad_mean=None, grad_invvar=None):
    if grad_output is None:  # only mean / invvar were used
        return None, None, None, None, None, None
    kept, mean, invvar, weight, bias = ctx.saved_tensors
    grad_input, grad_weight, grad_bias = torch.ops.apex.layer_norm_bwd(
        grad_output, mean, invvar, kept, ctx.normalized_shape, weight, bias, ctx.eps, ctx.memory_efficient)
    return (_in_input_dtype(ctx, grad_input), None, grad_weight if weight is not None else None,
            grad_bias if bias is not None else None, None, None)


def _rms_norm_backward(ctx, grad_output, grad_invvar=None):
    if grad_output is None:  # only invvar was used
        return None, None, None, None, None
    kept, invvar, weight, _ = ctx.saved_tensors
    grad_input, grad_weight = torch.ops.apex.rms_norm_bwd(
        grad_output, invvar, kept, ctx.normalized_shape, weight, ctx.eps, ctx.memory_efficient)
    return _in_input_dtype(ctx, grad_input), None, grad_weight if weight is not None else None, None, None


# The backward formula of each forward op, for both ways in.
_BACKWARD = {"layer_norm_fwd": _layer_norm_backward, "rms_norm_fwd": _rms_norm_backward}


def _register() -> None:
    for name, fake in (("layer_norm_fwd", _layer_norm_fwd_fake), ("rms_norm_fwd", _rms_norm_fwd_fake),
                       ("layer_norm_bwd", _layer_norm_bwd_fake), ("rms_norm_bwd", _rms_norm_bwd_fake)):
        torch.library.register_fake(f"apex::{name}", fake)
    for name, backward in _BACKWARD.items():
        torch.library.register_autograd(f"apex::{name}", backward, setup_context=_setup_context)


def run(op_name: str, args) -> torch.Tensor:
    """``torch.ops.apex.<op_name>(*args)[0]`` (layer_norm_fwd or rms_norm_fwd) with autograd, at the least host cost.

    Traced (torch.compile, export) or under torch.func, the custom op with its registered autograd
    is what those systems understand. Plain eager calls take NormFunction (the same op and
    formula in a plain autograd.Function: register_autograd's Python machinery, which fills
    default arguments, builds a Function and redispatches, costs ~100 µs per forward+backward),
    or, with grad mode off, the bare kernel.
    """
    op = getattr(torch.ops.apex, op_name)
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active():
        return op(*args)[0]
    if torch.is_grad_enabled():
        return NormFunction.apply(op, _BACKWARD[op_name], *args)
    with torch._C._AutoDispatchBelowAutograd():  # no graph to record
        return op(*args)[0]


class NormFunction(torch.autograd.Function):
    """Eager autograd of a forward op: apply(op, its backward formula, *op inputs) -> the op's output."""

    @staticmethod
    def forward(ctx, op, backward, *inputs):
        with torch._C._AutoDispatchBelowAutograd():  # skip the op's own (register_autograd) kernel
            outputs = op(*inputs)
        _setup_context(ctx, inputs, outputs)
        ctx.backward_formula = backward
        # The output only: mean / invvar stay in ctx, so autograd tracks one tensor instead of three.
        return outputs[0]

    @staticmethod
    def backward(ctx, grad_output):
        return None, None, *ctx.backward_formula(ctx, grad_output)
