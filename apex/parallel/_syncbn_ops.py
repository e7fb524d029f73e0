"""Loading of the apex::syncbn_* ops, plus their fake implementations for torch.compile.

The ops (schemas, CPU and CUDA kernels) are compiled C++ (csrc/syncbn/); loading the
module defines them. Statistics come back in float32 (float64 for float64 input).
"""
from __future__ import annotations

import torch

_OP_MODULE = "syncbn"
_loaded = False


def ops():
    """``torch.ops.apex`` with the syncbn ops loaded (compiled on first use)."""
    global _loaded
    if not _loaded:
        from op_builder import load_op

        load_op(_OP_MODULE)
        _register_fakes()
        _loaded = True
    return torch.ops.apex


def statistics_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


def _channel_vector(input: torch.Tensor, channels: int) -> torch.Tensor:
    return input.new_empty((channels,), dtype=statistics_dtype(input.dtype))


def _register_fakes() -> None:
    fake = torch.library.register_fake

    @fake("apex::syncbn_welford_mean_var")
    def _(input):
        return _channel_vector(input, input.shape[1]), _channel_vector(input, input.shape[1])

    @fake("apex::syncbn_welford_mean_var_c_last")
    def _(input):
        return _channel_vector(input, input.shape[-1]), _channel_vector(input, input.shape[-1])

    @fake("apex::syncbn_welford_parallel")
    def _(mean, var_biased, count, eps):
        out = mean.new_empty((mean.shape[1],), dtype=statistics_dtype(mean.dtype))
        return out, torch.empty_like(out), torch.empty_like(out)

    @fake("apex::syncbn_batchnorm_forward")
    def _(input, mean, inv_std, weight, shift):
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    @fake("apex::syncbn_batchnorm_forward_c_last")
    def _(input, z, mean, inv_std, weight, shift, fuse_relu):
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    def reduce_bn(grad_output, input, mean, inv_std, weight, channels):
        sums = _channel_vector(input, channels)
        grads = (weight.new_empty((channels,)) if weight is not None else sums.new_empty((0,)))
        return sums, torch.empty_like(sums), grads, torch.empty_like(grads)

    @fake("apex::syncbn_reduce_bn")
    def _(grad_output, input, mean, inv_std, weight):
        return reduce_bn(grad_output, input, mean, inv_std, weight, input.shape[1])

    @fake("apex::syncbn_reduce_bn_c_last")
    def _(grad_output, input, mean, inv_std, weight):
        return reduce_bn(grad_output, input, mean, inv_std, weight, input.shape[-1])

    @fake("apex::syncbn_batchnorm_backward")
    def _(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count):
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    @fake("apex::syncbn_batchnorm_backward_c_last")
    def _(grad_output, input, mean, inv_std, weight, sum_dy, sum_dy_xmu, count):
        return torch.empty_like(input, memory_format=torch.contiguous_format)

    @fake("apex::syncbn_relu_bw_c_last")
    def _(grad_output, input, z, mean, inv_std, weight, shift):
        return torch.empty_like(input, memory_format=torch.contiguous_format)
