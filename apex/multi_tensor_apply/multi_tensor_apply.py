"""NVIDIA apex's MultiTensorApply: calls an amp_C kernel on lists of tensors in chunks."""
from __future__ import annotations

from typing import Any, Callable, Sequence

import torch


class MultiTensorApply:
    """Calls ``op(chunk_size, noop_flag, tensor_lists, *args)``.

    ``op`` is an ``amp_C`` function (e.g. ``amp_C.multi_tensor_scale``); ``noop_flag`` is an
    int32 tensor of one element on the tensors' device that kernels set to 1 on inf/nan
    (and that some skip on); ``tensor_lists`` is a list of equally long lists of tensors
    (for example ``[grads, params, exp_avgs, exp_avg_sqs]``). ``chunk_size`` is the number of
    elements a CUDA block (or CPU task) handles at a time.
    """

    available = False
    import_err: Exception | None = None

    def __init__(self, chunk_size: int):
        self.chunk_size = chunk_size
        try:
            from apex.op_builder import builder_for

            compatible, reason = builder_for("amp_C").is_compatible()
            MultiTensorApply.available = compatible
            MultiTensorApply.import_err = None if compatible else RuntimeError(reason)
        except Exception as err:  # an unusable builder must not break `import apex`
            MultiTensorApply.available = False
            MultiTensorApply.import_err = err

    def check_avail(self) -> None:
        if not MultiTensorApply.available:
            raise RuntimeError(
                f"apex.multi_tensor_apply: amp_C is not available here: {MultiTensorApply.import_err}")

    def __call__(self, op: Callable[..., Any], noop_flag_buffer: torch.Tensor,
                 tensor_lists: Sequence[Sequence[torch.Tensor]], *args: Any) -> Any:
        self.check_avail()
        return op(self.chunk_size, noop_flag_buffer, tensor_lists, *args)
