"""The autograd function behind apex.parallel.SyncBatchNorm.

Forward: each rank computes per-channel mean and biased variance of its input
(Welford), the ranks all_gather (mean, var, count) in one collective, and
welford_parallel merges them into the global statistics - exact for any mix of
per-rank batch sizes. Backward: each rank reduces sum(dy) and sum(dy * (x - mean)),
one all_reduce makes them global, and the input gradient follows element-wise.

Nothing here waits for the GPU: counts are written on the device (torch.full), never
copied from the host, because a blocking host-to-device copy would stall the host until
every queued kernel finished, leaving the GPU idle while the next launches are issued.
For the same reason the forward queues its small side work (parameter conversions before
the statistics, running-statistics updates after the normalization) so that few host
calls separate the two large kernels.

A step is host-bound on a fast GPU (the kernels take less time than the Python,
dispatcher and autograd work that launches them), so this function keeps the ops it
dispatches few: a channels_last-strided (N, C, *) input is viewed as (N, *, C) here,
not by permute nodes in the autograd graph; dtype conversions that
would change nothing are not dispatched; the running statistics take one foreach op.

Inputs arrive as (N, C, *), as (*, C) with ``channel_last=True``, or as (N, C, *) stored
channels-last with ``permuted=True`` (the kernels then see its (N, *, C) view).

A step of one process has no collective between the kernels, nor has any step in eval (running
statistics): ``batch_norm_single_process`` and ``batch_norm_eval`` run it as one differentiable C++ op
each way (syncbn_batch_norm / syncbn_batch_norm_eval, formulas in C++; running statistics updated by
the kernel that computes the batch statistics), which costs the host about what torch's BatchNorm
does, where this autograd.Function costs twice that. The function serves the collective case only.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from apex._ops import eager_op, ops, through_torch_ops

# Newer torch renamed all_gather_into_tensor (and deprecated the old name).
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _to_channels_innermost(t: torch.Tensor) -> torch.Tensor:
    """(N, C, *spatial) -> the (N, *spatial, C) view (no copy for channels_last-strided tensors)."""
    return t.permute(0, *range(2, t.dim()), 1)


def _from_channels_innermost(t: torch.Tensor) -> torch.Tensor:
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def _count_tensor(count: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """[count] on ``device``, filled there (torch.tensor([count]) would be a blocking host copy)."""
    return torch.full((1,), count, dtype=dtype, device=device)


def _cast(t: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """``t`` in ``dtype``; no dispatcher round trip when it already is (fp32 parameters and statistics)."""
    return t if t is None or t.dtype == dtype else t.to(dtype)


def batch_norm_single_process(input, z, weight, bias, running_mean, running_var, momentum, eps, channel_last,
                              permuted, fuse_relu):
    """One process's step with batch statistics (no collective); running statistics, when given, move
    toward them by ``momentum`` (a float, or a tensor for the cumulative average). Arguments as
    SyncBatchnormFunction's."""
    if isinstance(momentum, torch.Tensor):  # the op takes a float: this update is done here
        out, mean, var, _ = ops("syncbn").syncbn_batch_norm(input, z, weight, bias, None, None, 0.0, eps, channel_last,
                                                            permuted, fuse_relu)
        if running_mean is not None:  # mean and var need no grad: statistics, not differentiable outputs
            _update_running_stats(running_mean, running_var, mean, var, momentum)
        return out
    if momentum is None:  # no running statistics
        momentum = 0.0
    if through_torch_ops(input, z, weight, bias):
        return ops("syncbn").syncbn_batch_norm(input, z, weight, bias, running_mean, running_var, momentum, eps,
                                               channel_last, permuted, fuse_relu)[0]
    # The op's first output alone (*_output), for eager calls.
    return eager_op("syncbn", "syncbn_batch_norm_output")(input, z, weight, bias, running_mean, running_var, momentum,
                                                          eps, channel_last, permuted, fuse_relu)


def batch_norm_eval(input, z, weight, bias, running_mean, running_var, eps, channel_last, permuted, fuse_relu):
    """A step normalized with the running statistics (eval): no collective, whatever the world size."""
    if through_torch_ops(input, z, weight, bias):
        return ops("syncbn").syncbn_batch_norm_eval(input, z, weight, bias, running_mean, running_var, eps,
                                                    channel_last, permuted, fuse_relu)[0]
    return eager_op("syncbn", "syncbn_batch_norm_eval_output")(input, z, weight, bias, running_mean, running_var, eps,
                                                               channel_last, permuted, fuse_relu)


def _gather_statistics(mean, var_biased, count, group, world_size):
    """[world, C] means and biased variances and [world] counts of every rank in ``group``."""
    channels = mean.numel()
    # One float64 row per rank, [mean | var | count]: float64 carries counts exactly and
    # loses nothing of float32 statistics (cat promotes the float32 parts).
    local = torch.cat([mean, var_biased, _count_tensor(count, torch.float64, mean.device)])
    table = local.new_empty(world_size * local.numel())  # flat: the form every backend accepts
    _all_gather_flat(table, local, group=group)
    means, variances, counts = table.view(world_size, -1).split([channels, channels, 1], dim=1)
    return _cast(means, mean.dtype), _cast(variances, mean.dtype), counts.view(-1).long()  # exact: whole numbers


def _update_running_stats(running_mean, running_var, mean, var, momentum):
    """running = lerp(running, batch statistic, momentum), as torch.nn.BatchNorm (var unbiased)."""
    mean, var = _cast(mean, running_mean.dtype), _cast(var, running_var.dtype)
    if isinstance(momentum, torch.Tensor):  # momentum=None: 1 / num_batches_tracked, on the device
        running_mean.lerp_(mean, momentum)
        running_var.lerp_(var, momentum)
    else:
        torch._foreach_lerp_([running_mean, running_var], [mean, var], momentum)


class SyncBatchnormFunction(torch.autograd.Function):
    """A step with batch statistics over the ``world_size`` (> 1) ranks of ``process_group``."""

    @staticmethod
    def forward(ctx, input, z, weight, bias, running_mean, running_var, eps, momentum, process_group, world_size,
                channel_last, permuted, fuse_relu):
        apex = ops("syncbn")
        if permuted:
            input = _to_channels_innermost(input)
            z = _to_channels_innermost(z) if z is not None else None
        input = input.contiguous()
        z = z.contiguous() if z is not None else None
        channels = input.size(-1) if channel_last else input.size(1)
        # The kernels read affine parameters in the statistics dtype; converted once, here,
        # and kept for backward.
        accumulate_dtype = torch.promote_types(input.dtype, torch.float32)  # float32, float64 for float64
        weight_acc, bias_acc = _cast(weight, accumulate_dtype), _cast(bias, accumulate_dtype)
        welford = apex.syncbn_welford_mean_var_c_last if channel_last else apex.syncbn_welford_mean_var
        mean, var_biased = welford(input)
        means, variances, counts = _gather_statistics(mean, var_biased, input.numel() // channels, process_group,
                                                      world_size)
        mean, var, inv_std = apex.syncbn_welford_parallel(means, variances, counts, eps)

        if channel_last:
            out = apex.syncbn_batchnorm_forward_c_last(input, z, mean, inv_std, weight_acc, bias_acc, fuse_relu)
        else:
            out = apex.syncbn_batchnorm_forward(input, mean, inv_std, weight_acc, bias_acc)
        if running_mean is not None:  # forward runs without grad recording
            _update_running_stats(running_mean, running_var, mean, var, momentum)
        if fuse_relu:
            ctx.save_for_backward(input, weight, weight_acc, mean, inv_std, counts, z, bias_acc)
        else:
            ctx.save_for_backward(input, weight, weight_acc, mean, inv_std, counts)
        ctx.process_group = process_group
        ctx.channel_last, ctx.permuted, ctx.fuse_relu, ctx.has_z = channel_last, permuted, fuse_relu, z is not None
        # The kernel's (N, *, C) output seen as (N, C, *); detached, so it is a plain output of
        # this function, not a view of a tensor made inside it (which in-place ops would reject).
        return _from_channels_innermost(out).detach() if permuted else out

    @staticmethod
    @torch.autograd.function.once_differentiable  # the syncbn ops have no derivatives of their own
    def backward(ctx, grad_output):
        apex = ops("syncbn")
        input, weight, weight_acc, mean, inv_std, counts, *relu_saved = ctx.saved_tensors
        if ctx.permuted:
            grad_output = _to_channels_innermost(grad_output)
        grad_output = grad_output.contiguous()
        if ctx.fuse_relu:
            z, bias_acc = relu_saved
            grad_output = apex.syncbn_relu_bw_c_last(grad_output, input, z, mean, inv_std, weight_acc, bias_acc)
        grad_z = grad_output.clone() if ctx.has_z and ctx.needs_input_grad[1] else None

        reduce_bn = apex.syncbn_reduce_bn_c_last if ctx.channel_last else apex.syncbn_reduce_bn
        # The parameter's own weight: grad_weight and grad_bias come back in its dtype.
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = reduce_bn(grad_output, input, mean, inv_std, weight)

        grad_input = None
        if ctx.needs_input_grad[0]:
            combined = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(combined, op=dist.ReduceOp.SUM, group=ctx.process_group)
            sum_dy, sum_dy_xmu = combined.chunk(2)
            backward = apex.syncbn_batchnorm_backward_c_last if ctx.channel_last else apex.syncbn_batchnorm_backward
            grad_input = backward(grad_output, input, mean, inv_std, weight_acc, sum_dy, sum_dy_xmu, counts)

        if not ctx.needs_input_grad[2]:  # also when there is no weight (None inputs need no grad)
            grad_weight = None
        if not ctx.needs_input_grad[3]:
            grad_bias = None
        if ctx.permuted:
            grad_input = _from_channels_innermost(grad_input) if grad_input is not None else None
            grad_z = _from_channels_innermost(grad_z) if grad_z is not None else None
        return grad_input, grad_z, grad_weight, grad_bias, *(None,) * 9
