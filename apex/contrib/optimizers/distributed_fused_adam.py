"""DistributedFusedAdam: Adam / AdamW with ZeRO-2 sharding on torch.distributed (NVIDIA apex's API)."""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch

from apex.contrib.optimizers._shards import ShardWork, group_lists
from apex.contrib.optimizers._zero_optimizer import ZeroOptimizer
from apex.multi_tensor_apply import multi_tensor_applier
from apex.optimizers._fused_optimizer import amp_c, check_hyperparameters


class DistributedFusedAdam(ZeroOptimizer):
    """Adam (``adam_w_mode=False``, L2 weight decay) or AdamW (default) whose state is sharded
    over the ranks of ``distributed_process_group`` (ZeRO-2).

    Each rank keeps the moments (and parameter copy) of 1/N of the elements, receives only
    that part of the averaged gradients (reduce-scatter of flat buckets, overlapped with
    backward), updates it with apex's fused Adam kernel and all-gathers the new parameters.
    The result is AdamW over the global batch: the same as one process running
    ``torch.optim.AdamW`` on the concatenated batches. Construct it after
    ``torch.distributed.init_process_group`` (NCCL for CUDA parameters, gloo for CPU ones);
    rank 0's parameter values are broadcast at construction.

    Use ``optimizer.clip_grad_norm(max_norm)`` and ``optimizer.grad_norm()`` instead of
    ``torch.nn.utils.clip_grad_norm_``, ``optimizer.no_sync()`` for gradient accumulation, and
    ``optimizer.unscale_grads(grad_scaler=scaler)`` instead of ``scaler.unscale_(optimizer)``:
    after backward the gradients live in the optimizer's buckets, not in ``param.grad``.

    Args:
        params: parameters or param-group dicts (one device for all; float32, float16, bfloat16
            or float64, the last stepped in ``dtype``).
        lr, bias_correction, betas, eps, weight_decay: as in ``apex.optimizers.FusedAdam``.
        adam_w_mode: decoupled weight decay (AdamW) when True, L2 added to the gradient when False.
        amsgrad: not supported; True raises RuntimeError.

    Keyword options (the ZeRO machinery, shared with DistributedFusedLAMB):
        dtype: dtype of the optimizer state (moments and parameter copy): float32 (default),
            float16 or bfloat16.
        grad_sync_dtype: dtype gradients are bucketed and reduced in (default: ``dtype``).
        param_sync_dtype: dtype parameters are gathered in (default: ``dtype``). An integer type
            (uint8, int16, int32, int64, ...) gathers the most significant bytes of each value,
            as NVIDIA apex: int32/int64 carry fp32 parameters bit for bit, uint8 carries the top
            byte of fp16 ones (fp8 e5m2 by truncation). ``init_params(params, grad_sync_dtype=...,
            param_sync_dtype=...)`` sets either for some parameters only.
        device: the parameters' device (default: theirs; given, it must match).
        process_group: all ranks taking part (default: the default group) = a
            distributed_size x redundant_size grid of the two groups below.
        distributed_process_group: ranks the state is sharded over (default: ``process_group``).
        redundant_process_group: ranks holding the same shard, whose gradients are
            all-reduced after the reduce-scatter (default: none).
        average_grad_sync: average the gradients over ranks (True) or sum them.
        overlap_grad_sync: reduce-scatter each bucket as soon as backward has filled it.
        overlap_param_sync: leave the all-gathers of a step running; a parameter waits for its
            own buckets the first time it is touched (any op, attribute or method: the next
            forward, ``param.data``, a state dict), so the gathers overlap what comes before.
            Until then its class is a subclass of its own: before a torch.compile'd forward,
            call ``param_sync()``.
        bucket_cap_mb: bucket size in MiB of ``grad_sync_dtype`` elements (the last bucket is
            trimmed). When the buckets would be less than 70% full, the layout warns ("Consider
            decreasing the bucket_cap_mb argument"), as NVIDIA apex: big buckets overlap less.
        pipeline_size: buckets updated at a time (the all-gather of one batch overlaps the
            update of the next) and reduce-scatters in flight during backward.
        contiguous_param_buffer: make the parameters views of one buffer laid out like the
            buckets, so the all-gather writes into them directly (parameters must all be
            ``param_sync_dtype``, or of its size when that is an integer type).
        contiguous_grad_buffer: keep the gradients in one persistent buffer. After
            ``zero_grad()`` (``set_to_none=False``) ``param.grad`` of parameters in
            ``grad_sync_dtype`` are zeroed views into it and autograd accumulates in place; after
            ``zero_grad(set_to_none=True)`` they are None and the backward hook copies each new
            gradient into the buffer, which then is never zeroed (the faster). Without it the
            gradients go into bucket buffers that are freed once reduce-scattered.
        store_params: keep a ``dtype`` copy of the local parameter shard (a master copy), when
            the parameters or ``param_sync_dtype`` differ from ``dtype`` (a copy of what the
            parameters already hold exactly would be skipped anyway).
        store_param_remainders: bf16 parameters, float32 state: keep only the 16 low bits the
            bf16 parameters drop, which restore the float32 master values exactly (2 bytes
            per element instead of 4). Needs ``param_sync_dtype=torch.bfloat16``.
        with_scaled_states: store the moments and parameter copy in ``dtype`` (fp16/bf16),
            scaled per parameter fragment to use that type's whole range (FP8-LM).
        nccl_ub: allocate the contiguous gradient buffer and the reduce-scatter outputs as NCCL
            user buffers (``ncclMemAlloc``, registered with the communicator: zero-copy
            collectives, e.g. SHARP with one SM). Needs ``contiguous_grad_buffer``, CUDA
            parameters, an NCCL process group and torch >= 2.7; RuntimeError otherwise (as
            NVIDIA apex without its NCCL allocator). Averaging then divides before summing.
        capturable: keep the step count on the device and skip an overflowing step on the
            device too, so that ``step()`` makes no host synchronization.

    State dicts: see ``state_dict``; a gathered one loads on any number of ranks and into
    ``apex.optimizers.FusedAdam`` on one GPU.
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        bias_correction: bool = True,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        adam_w_mode: bool = True,
        weight_decay: float = 0.0,
        amsgrad: bool = False,
        **zero_options: Any,
    ) -> None:
        if amsgrad:
            raise RuntimeError("DistributedFusedAdam does not support the AMSGrad variant.")
        check_hyperparameters(lr=lr, eps=eps, betas=betas, weight_decay=weight_decay)
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        self.adam_w_mode = adam_w_mode
        super().__init__(params, defaults, **zero_options)

    def _step_buckets(self) -> None:
        self._gather_pipeline(self._bucket_batches(), lambda batch: [self._begin(b) for b in batch], self._adam)

    def _adam(self, works: list[ShardWork]) -> None:
        """One fused Adam launch per param group over the fragments of ``works``. The kernel
        reads lr, step and the gradient scale (1 / loss scale x clipping) from the device and
        skips the update while the noop flag holds a found inf."""
        for index, group in enumerate(self.param_groups):
            lists, _ = group_lists(works, index)
            if not lists[0]:
                continue
            beta1, beta2 = group["betas"]
            multi_tensor_applier(
                amp_c().multi_tensor_adam_capturable, self._noop_flag, lists, self._group_lr(index), beta1, beta2,
                group["eps"], self._step_tensor, 1 if self.adam_w_mode else 0, 1 if group["bias_correction"] else 0,
                group["weight_decay"], self._grad_scale,
            )  # fmt: skip
