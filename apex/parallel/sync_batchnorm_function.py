"""The autograd function behind apex.parallel.SyncBatchNorm.

Forward: each rank computes per-channel mean and biased variance of its input
(Welford), the ranks all_gather (mean, var, count) in one collective, and
welford_parallel merges them into the global statistics - exact for any mix of
per-rank batch sizes. Backward: each rank reduces sum(dy) and sum(dy * (x - mean)),
one all_reduce makes them global, and the input gradient follows element-wise.

Nothing here waits for the GPU: counts are written on the device (torch.full), never
copied from the host, because a blocking host-to-device copy would stall the host
until every queued kernel finished, leaving the GPU idle while the next launches are
issued. For the same reason the forward queues its small side work (parameter
conversions before the statistics, running-statistics updates after the
normalization) so that few host calls separate the two large kernels.

Inputs reach this function already in a kernel layout: (N, C, *) contiguous, or
(*, C) contiguous with ``channel_last=True``.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from apex.parallel._syncbn_ops import ops, statistics_dtype

# Newer torch renamed all_gather_into_tensor (and deprecated the old name).
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


def _gather_statistics(mean, var_biased, count, group, world_size):
    """[world, C] means and biased variances and [world] counts of every rank in ``group``."""
    channels = mean.numel()
    # One float64 row per rank, [mean | var | count]: float64 carries counts exactly and
    # loses nothing of float32 statistics (cat promotes the float32 parts).
    local = torch.cat([mean, var_biased, torch.full((1,), count, dtype=torch.float64, device=mean.device)])
    table = local.new_empty(world_size * local.numel())  # flat: the form every backend accepts
    _all_gather_flat(table, local, group=group)
    means, variances, counts = table.view(world_size, -1).split([channels, channels, 1], dim=1)
    return means.to(mean.dtype), variances.to(mean.dtype), counts.view(-1).long()  # exact: whole numbers


class SyncBatchnormFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, input, z, weight, bias, running_mean, running_var, eps, use_batch_stats, momentum,
                process_group, world_size, channel_last, fuse_relu):
        apex = ops()
        channels = input.size(-1) if channel_last else input.size(1)
        # The kernels read affine parameters in the statistics dtype; converted once, here,
        # and kept for backward.
        weight_acc, bias_acc = (t.to(statistics_dtype(input.dtype)) if t is not None else None for t in (weight, bias))
        if use_batch_stats:
            welford = apex.syncbn_welford_mean_var_c_last if channel_last else apex.syncbn_welford_mean_var
            mean, var_biased = welford(input)
            local_count = input.numel() // channels
            if world_size > 1:
                means, variances, counts = _gather_statistics(mean, var_biased, local_count, process_group, world_size)
            else:
                if local_count <= 1:
                    raise ValueError(f"SyncBatchNorm: expected more than 1 value per channel when training, got input "
                                     f"of shape {tuple(input.shape)}")
                means, variances = mean.unsqueeze(0), var_biased.unsqueeze(0)
                counts = torch.full((1,), local_count, dtype=torch.long, device=input.device)
            mean, var, inv_std = apex.syncbn_welford_parallel(means, variances, counts, eps)
        else:
            mean = running_mean.to(statistics_dtype(input.dtype))
            inv_std = torch.rsqrt(running_var.to(mean.dtype) + eps)
            counts = None

        if channel_last:
            out = apex.syncbn_batchnorm_forward_c_last(input, z, mean, inv_std, weight_acc, bias_acc, fuse_relu)
        else:
            out = apex.syncbn_batchnorm_forward(input, mean, inv_std, weight_acc, bias_acc)
        if use_batch_stats and running_mean is not None:
            with torch.no_grad():
                running_mean.lerp_(mean.to(running_mean.dtype), momentum)
                running_var.lerp_(var.to(running_var.dtype), momentum)
        ctx.save_for_backward(input, z, weight, weight_acc, bias_acc, mean, inv_std, counts)
        ctx.process_group, ctx.world_size = process_group, world_size
        ctx.channel_last, ctx.fuse_relu = channel_last, fuse_relu
        return out

    @staticmethod
    def backward(ctx, grad_output):
        apex = ops()
        input, z, weight, weight_acc, bias_acc, mean, inv_std, counts = ctx.saved_tensors
        grad_output = grad_output.contiguous()
        if ctx.fuse_relu:
            grad_output = apex.syncbn_relu_bw_c_last(grad_output, input, z, mean, inv_std, weight_acc, bias_acc)
        grad_z = grad_output.clone() if z is not None and ctx.needs_input_grad[1] else None

        reduce_bn = apex.syncbn_reduce_bn_c_last if ctx.channel_last else apex.syncbn_reduce_bn
        # The parameter's own weight: grad_weight and grad_bias come back in its dtype.
        sum_dy, sum_dy_xmu, grad_weight, grad_bias = reduce_bn(grad_output, input, mean, inv_std, weight)

        grad_input = None
        if ctx.needs_input_grad[0]:
            if counts is None:
                # Running statistics are constants: dx = dy * inv_std * weight.
                sum_dy, sum_dy_xmu = torch.zeros_like(sum_dy), torch.zeros_like(sum_dy_xmu)
                counts = torch.ones(1, dtype=torch.long, device=input.device)
            elif ctx.world_size > 1:
                combined = torch.cat([sum_dy, sum_dy_xmu])
                dist.all_reduce(combined, op=dist.ReduceOp.SUM, group=ctx.process_group)
                sum_dy, sum_dy_xmu = combined.chunk(2)
            backward = apex.syncbn_batchnorm_backward_c_last if ctx.channel_last else apex.syncbn_batchnorm_backward
            grad_input = backward(grad_output, input, mean, inv_std, weight_acc, sum_dy, sum_dy_xmu, counts)

        if weight is None or not ctx.needs_input_grad[2]:
            grad_weight = None
        if bias_acc is None or not ctx.needs_input_grad[3]:
            grad_bias = None
        return grad_input, grad_z, grad_weight, grad_bias, None, None, None, None, None, None, None, None, None
