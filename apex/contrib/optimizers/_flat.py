"""Parameters as flat runs of elements in memory order, the way buckets hold them.

A contiguous tensor flattens as ``view(-1)``; a channels-last one (NHWC / NDHWC in memory) as
the view of its permuted, contiguous form. Gradients are read in their parameter's memory
order, so a bucket never mixes two orders.
"""
from __future__ import annotations

import torch

_CHANNELS_LAST = {4: (torch.channels_last, (0, 2, 3, 1)), 5: (torch.channels_last_3d, (0, 2, 3, 4, 1))}


def memory_format(tensor: torch.Tensor) -> torch.memory_format | None:
    """The dense memory format ``tensor`` is laid out in, or None when it is not dense."""
    if tensor.is_contiguous():
        return torch.contiguous_format
    channels_last = _CHANNELS_LAST.get(tensor.dim())
    if channels_last and tensor.is_contiguous(memory_format=channels_last[0]):
        return channels_last[0]
    return None


def flat_view(tensor: torch.Tensor, like: torch.Tensor | None = None) -> torch.Tensor:
    """``tensor``'s elements in the memory order of ``like`` (default: its own), as a 1-D view
    when its layout matches, else as a 1-D copy."""
    target = memory_format(tensor if like is None else like)
    if target is None:
        raise ValueError("only contiguous or channels-last tensors can be flattened in memory order")
    if memory_format(tensor) != target:
        tensor = tensor.contiguous(memory_format=target)
    if target is torch.contiguous_format:
        return tensor.view(-1)
    return tensor.permute(_CHANNELS_LAST[tensor.dim()][1]).reshape(-1)


def shaped_like(flat: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """The 1-D ``flat`` seen with ``like``'s shape and strides (the inverse of ``flat_view``)."""
    return flat.as_strided(like.size(), like.stride())
