"""The amp_C functions whose NVIDIA apex name or return value differ from their op's (every other
``amp_C.<name>`` is ``torch.ops.apex.<name>`` taking apex's list of tensor lists)."""
from __future__ import annotations

from collections.abc import Sequence

import torch

from apex._ops import ops

__all__ = ["multi_tensor_lamb_stage1_cuda", "multi_tensor_lamb_stage2_cuda", "update_scale_hysteresis"]


def multi_tensor_lamb_stage1_cuda(chunk_size: int, noop_flag: torch.Tensor,
                                  tensor_lists: Sequence[Sequence[torch.Tensor]], *args) -> None:
    """apex's LAMB stage 1 on [grads, params, exp_avgs, exp_avg_sqs, updates] (any device despite the name)."""
    ops("amp_C").multi_tensor_lamb_stage1(chunk_size, noop_flag, *tensor_lists, *args)


def multi_tensor_lamb_stage2_cuda(chunk_size: int, noop_flag: torch.Tensor,
                                  tensor_lists: Sequence[Sequence[torch.Tensor]], *args, **kwargs) -> None:
    """apex's LAMB stage 2 on [params, updates] (any device despite the name)."""
    ops("amp_C").multi_tensor_lamb_stage2(chunk_size, noop_flag, *tensor_lists, *args, **kwargs)


def update_scale_hysteresis(current_scale: torch.Tensor, growth_tracker: torch.Tensor,
                            hysteresis_tracker: torch.Tensor, found_inf: torch.Tensor, growth_factor: float,
                            backoff_factor: float, growth_interval: int, hysteresis: int) -> torch.Tensor:
    """amp's loss-scale update with hysteresis; returns ``current_scale`` (updated in place), as apex does."""
    ops("amp_C").amp_update_scale_hysteresis(current_scale, growth_tracker, hysteresis_tracker, found_inf,
                                             growth_factor, backoff_factor, growth_interval, hysteresis)
    return current_scale
