"""apex.parallel.SyncBatchNorm: batch norm whose statistics cover the global batch."""
from __future__ import annotations

import torch
from torch.nn.modules.batchnorm import _BatchNorm

from apex.parallel import _process_group
from apex.parallel.sync_batchnorm_function import (SyncBatchnormFunction, batch_norm_eval,
                                                    batch_norm_single_process)


_CHANNELS_LAST_FORMATS = {4: torch.channels_last, 5: torch.channels_last_3d}


def _is_channels_last_strided(t: torch.Tensor) -> bool:
    memory_format = _CHANNELS_LAST_FORMATS.get(t.dim())
    return memory_format is not None and not t.is_contiguous() and t.is_contiguous(memory_format=memory_format)


class SyncBatchNorm(_BatchNorm):
    r"""Batch normalization over the batch of every process in ``process_group``.

    Per-channel statistics are merged across ranks with parallel Welford (exact for
    different per-rank batch sizes); running statistics follow torch.nn.BatchNorm
    (unbiased variance in ``running_var``). Without an initialized torch.distributed
    default group, it behaves as torch.nn.BatchNorm on the local batch.

    Args:
        num_features: C.
        eps, momentum, affine, track_running_stats: as torch.nn.BatchNorm2d
            (``momentum=None`` gives a cumulative moving average).
        process_group: the ranks whose batches are normalized together (default: all).
        channel_last: input is (N, H, W, C) with C the last dimension (4-D only).
        fuse_relu: apply ReLU to the output (after adding ``z``); needs a channels-last layout.

    Shapes: input (N, C), (N, C, L), (N, C, H, W), (N, C, D, H, W) in float16, bfloat16,
    float32 or float64; or (N, H, W, C) with ``channel_last``. NCHW inputs stored
    channels_last (``memory_format=torch.channels_last``) run the channels-last kernels
    without a copy and give a channels_last output. ``forward(input, z=None)``: ``z``, of
    the input's shape and dtype, is added before the ReLU (channels-last layouts only).
    """

    def __init__(self, num_features, eps=1e-5, momentum=0.1, affine=True, track_running_stats=True,
                 process_group=None, channel_last=False, fuse_relu=False):
        super().__init__(num_features, eps, momentum, affine, track_running_stats)
        self.process_group = process_group
        self.channel_last = channel_last
        self.fuse_relu = fuse_relu

    def extra_repr(self) -> str:
        return super().extra_repr() + f", channel_last={self.channel_last}, fuse_relu={self.fuse_relu}"

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"SyncBatchNorm: expected an input of at least 2 dimensions (N, C, ...), got shape "
                             f"{tuple(input.shape)}")
        if self.channel_last and input.dim() != 4:
            raise ValueError(f"SyncBatchNorm(channel_last=True): expected a 4-D (N, H, W, C) input, got shape "
                             f"{tuple(input.shape)}")
        channels = input.size(-1) if self.channel_last else input.size(1)
        if channels != self.num_features:
            raise ValueError(f"SyncBatchNorm: expected {self.num_features} channels, got input of shape "
                             f"{tuple(input.shape)} ({channels} channels)")

    def _world_size(self) -> int:
        if not _process_group.is_initialized():
            if self.process_group is not None:
                _process_group.require_initialized("SyncBatchNorm with a process_group")
            return 1
        return _process_group.group_size(self.process_group, "SyncBatchNorm")

    def _state(self):
        """(weight, bias, running_mean, running_var, num_batches_tracked), read from the module's parameter
        and buffer tables: nn.Module.__getattr__, which ``self.weight`` goes through, costs ~0.6 us a name
        (a step reads five). Where a name has left its table (torch.nn.utils.parametrize moves a parameter
        out), the attributes are read as usual."""
        try:
            parameters, buffers = self._parameters, self._buffers
            return (parameters["weight"], parameters["bias"], buffers["running_mean"], buffers["running_var"],
                    buffers["num_batches_tracked"])
        except KeyError:
            return self.weight, self.bias, self.running_mean, self.running_var, self.num_batches_tracked

    def forward(self, input: torch.Tensor, z: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input_dim(input)
        if z is not None and z.shape != input.shape:
            raise ValueError(f"SyncBatchNorm: z must have the input's shape {tuple(input.shape)}, got {tuple(z.shape)}")

        # Kernel layout: (*, C) contiguous ("channels innermost") or (N, C, *) contiguous. A
        # channels_last-strided (N, C, *) input is "permuted": the function runs the
        # channels-innermost kernels on its (N, *, C) view and returns a channels_last output.
        permuted = False
        if self.channel_last or input.dim() == 2:
            channels_innermost = True
        elif _is_channels_last_strided(input):
            channels_innermost = permuted = True
        else:
            channels_innermost = False
        if (self.fuse_relu or z is not None) and not channels_innermost:
            raise ValueError("SyncBatchNorm: fuse_relu and z need a channels-last layout: construct with "
                             "channel_last=True, or pass a channels_last-strided (N, C, H, W) input")

        weight, bias, running_mean, running_var, num_batches_tracked = self._state()  # statistics: None unless tracked
        if not self.training and self.track_running_stats:  # running statistics: nothing to synchronize
            return batch_norm_eval(input, z, weight, bias, running_mean, running_var, self.eps, channels_innermost,
                                   permuted, self.fuse_relu)
        # Batch statistics; running statistics (tracked in training only) move toward them.
        momentum = self.momentum
        if self.training and self.track_running_stats:
            num_batches_tracked.add_(1)
            if momentum is None:  # cumulative average, kept on the device: float() would wait for the GPU
                momentum = num_batches_tracked.reciprocal()
        world_size = self._world_size()
        if world_size == 1:
            return batch_norm_single_process(input, z, weight, bias, running_mean, running_var, momentum, self.eps,
                                             channels_innermost, permuted, self.fuse_relu)
        return SyncBatchnormFunction.apply(
            input, z, weight, bias, running_mean, running_var, self.eps, momentum, self.process_group, world_size,
            channels_innermost, permuted, self.fuse_relu)
