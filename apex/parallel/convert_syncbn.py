"""Swap a model's BatchNorm layers for SyncBatchNorm, and build per-group process groups."""
from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.modules.batchnorm import _BatchNorm

from apex.parallel import _process_group
from apex.parallel.sync_batchnorm import SyncBatchNorm


def convert_syncbn_model(module: torch.nn.Module, process_group=None, channel_last: bool = False) -> torch.nn.Module:
    """Return ``module`` with every ``torch.nn.BatchNorm*d`` (recursively) replaced by
    :class:`SyncBatchNorm`. The new layers share the old ones' parameters and buffers
    (so an optimizer built before still updates them) and keep their train/eval mode.
    Instance norms are left alone."""
    converted = module
    if isinstance(module, _BatchNorm) and not isinstance(module, SyncBatchNorm):
        converted = SyncBatchNorm(module.num_features, module.eps, module.momentum, module.affine,
                                  module.track_running_stats, process_group=process_group, channel_last=channel_last)
        with torch.no_grad():
            if module.affine:
                converted.weight = module.weight
                converted.bias = module.bias
            converted.running_mean = module.running_mean
            converted.running_var = module.running_var
            converted.num_batches_tracked = module.num_batches_tracked
        converted.train(module.training)
    for name, child in module.named_children():
        converted.add_module(name, convert_syncbn_model(child, process_group, channel_last))
    return converted


def create_syncbn_process_group(group_size: int):
    """Split the world into consecutive groups of ``group_size`` ranks and return this
    rank's group (None for ``group_size == 0``: the whole world). Every rank must call it."""
    if group_size == 0:
        return None
    _process_group.require_initialized("create_syncbn_process_group")
    world_size = dist.get_world_size()
    if group_size < 0 or world_size % group_size != 0:
        raise ValueError(f"create_syncbn_process_group: group_size ({group_size}) must divide the world size "
                         f"({world_size})")
    mine = None
    for first in range(0, world_size, group_size):
        group = dist.new_group(ranks=list(range(first, first + group_size)))  # collective: every rank creates every group
        if first <= dist.get_rank() < first + group_size:
            mine = group
    return mine
