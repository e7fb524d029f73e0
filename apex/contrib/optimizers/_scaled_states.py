"""16-bit optimizer state with one float32 scale per parameter fragment (``with_scaled_states``).

As in FP8-LM (arXiv 2310.18313): a fragment's values are stored divided by a scale chosen
so that their largest magnitude lands at half the 16-bit type's maximum, which spends the
type's whole dynamic range on that fragment instead of on the global range of all values.
The step itself runs on float32 copies.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


class SegmentScales:
    """Scales for the segments of a flat shard: one per local fragment, plus the gaps between.

    ``ranges``: the fragments' ``(start, end)`` in the shard, ascending; ``size``: the shard's length.
    """

    def __init__(self, ranges: Sequence[tuple[int, int]], size: int, dtype: torch.dtype, device: torch.device) -> None:
        lengths, position = [], 0
        for start, end in ranges:
            if start > position:
                lengths.append(start - position)
            lengths.append(end - start)
            position = end
        if position < size:
            lengths.append(size - position)
        self.size = size
        self.lengths = torch.tensor(lengths, dtype=torch.int64, device=device)
        # Half of the type's maximum leaves room for the values to grow before the next rescale.
        self.target = torch.finfo(dtype).max / 2
        self.smallest = torch.finfo(torch.float32).tiny

    def new_scale(self) -> torch.Tensor:
        return torch.zeros(len(self.lengths), dtype=torch.float32, device=self.lengths.device)

    def _per_element(self, per_segment: torch.Tensor) -> torch.Tensor:
        return torch.repeat_interleave(per_segment, self.lengths, output_size=self.size)

    @torch.no_grad()
    def unscale(self, stored: torch.Tensor, scale: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (float32) = ``stored`` * its segment's scale."""
        return torch.mul(stored, self._per_element(scale), out=out)

    @torch.no_grad()
    def store(self, value: torch.Tensor, stored: torch.Tensor, scale: torch.Tensor) -> None:
        """Choose each segment's ``scale`` from float32 ``value`` and write the scaled values into ``stored``."""
        absmax = torch.segment_reduce(value.abs(), "max", lengths=self.lengths)
        # At least float32's smallest normal number: bf16's huge maximum would otherwise make the
        # scales of small values subnormal (or zero), whose reciprocals overflow to inf.
        torch.where(absmax > 0, (absmax / self.target).clamp_min(self.smallest), absmax, out=scale)
        inverse = torch.where(scale > 0, scale.reciprocal(), torch.zeros_like(scale))
        stored.copy_(value * self._per_element(inverse))
